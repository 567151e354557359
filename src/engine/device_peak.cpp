// The table of known peaks (device_peak.h); the device's name comes from
// device_peak_cuda.cpp or device_peak_none.cpp.
#include "tandem/engine/device_peak.h"

namespace tandem::engine {

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
