// A CUDA device's name, for its peak (engine::known_peak_flops), in the
// CUDA module.
#include <ATen/cuda/CUDAContext.h>

#include "module.h"

namespace tandem::cuda {

std::string device_name(int index) {
  if (index < 0) index = at::cuda::current_device();
  return at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name;
}

}  // namespace tandem::cuda
