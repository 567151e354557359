// known_peak_flops on a libtorch without CUDA: no device with a known peak.
#include "tandem/engine/device_peak.h"

namespace tandem::engine {

double known_peak_flops(const torch::Device& /*device*/) { return 0; }

}  // namespace tandem::engine
