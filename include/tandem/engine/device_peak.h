// tandem/engine/device_peak.h: the published peak of a device, for MFU
// (Note [peak for MFU] in src/engine/trainer_account.cpp).
#pragma once

#include <string>

#include <torch/types.h>

namespace tandem::engine {

// The dense bf16 tensor-core peak in FLOPs a second of a CUDA device whose
// figure is known (H100 and H200: 989.4e12, NVIDIA's SXM datasheets), else
// 0; 0 for any device of a libtorch without CUDA, and for the CPU.
double known_peak_flops(const torch::Device& device);

// The peak of a device called `name` (what CUDA calls it, "NVIDIA H100 80GB
// HBM3"), 0 when unknown: known_peak_flops's table, testable without one.
double peak_flops_of(const std::string& name);

}  // namespace tandem::engine
