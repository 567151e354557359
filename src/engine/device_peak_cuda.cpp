// known_peak_flops on a CUDA build of libtorch (the CMake file picks this
// file or device_peak_none.cpp).
#include <ATen/cuda/CUDAContext.h>

#include "tandem/engine/device_peak.h"

namespace tandem::engine {

double known_peak_flops(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto index = device.has_index() ? device.index() : at::cuda::current_device();
  return peak_flops_of(at::cuda::getDeviceProperties(index)->name);
}

}  // namespace tandem::engine
