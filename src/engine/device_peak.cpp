// The table of known peaks (device_peak.h); a CUDA device's name comes from
// the CUDA module (tandem/cuda/parts.h).
#include "tandem/engine/device_peak.h"

#include "tandem/cuda/parts.h"

namespace tandem::engine {

double known_peak_flops(const torch::Device& device) {
  if (!device.is_cuda()) return 0;
  const auto* parts = cuda::parts();
  return parts == nullptr ? 0 : peak_flops_of(parts->device_name(device.has_index() ? device.index() : -1));
}

double peak_flops_of(const std::string& name) {
  // Dense (not 2:4 sparse) bf16, SXM parts. The PCIe and NVL parts run
  // slower clocks; give them with --peak-tflops.
  if (name.find("H100") != std::string::npos && name.find("PCIe") == std::string::npos &&
      name.find("NVL") == std::string::npos) {
    return 989.4e12;
  }
  if (name.find("H200") != std::string::npos && name.find("NVL") == std::string::npos) return 989.4e12;
  return 0;
}

}  // namespace tandem::engine
