// tandem/optim/amp.h: automatic mixed precision, the autocast half.
//
//   optim::AutocastGuard autocast(torch::kCUDA, torch::kBFloat16);  // forward and loss
//   auto loss = loss_fn(model->forward(x), y);
//   }  // backward outside the guard, as in PyTorch
//
// Inside the guard, libtorch's autocast runs the ops that profit from lower
// precision (matrix products, convolutions) in `dtype` and keeps the ones
// that need range (reductions, softmax, losses) in float32, with PyTorch's
// own op lists. Autocast state is per thread: tandem's threads (DataParallel
// replicas, pipeline stages) take their caller's (at::ThreadLocalState).
// bf16 needs no loss scaling (float32's range); fp16 does: GradScaler.
// On the CPU, bf16 and fp16 autocast both run (slowly where the CPU has no
// native half arithmetic); on CUDA they are the point.
#pragma once

#include <optional>
#include <string>

#include <torch/types.h>

namespace tandem::optim {

// --amp: "off" -> nullopt, "bf16" -> kBFloat16, "fp16" -> kHalf; anything
// else is a tandem::Error naming --amp.
std::optional<torch::ScalarType> parse_amp(const std::string& text);

// Enables autocast to `dtype` for `device_type` in this thread until
// destroyed, then restores what was there (nests). A nullopt dtype does
// nothing, so `AutocastGuard g(type, parse_amp(flag))` reads plainly.
class AutocastGuard {
 public:
  AutocastGuard(torch::DeviceType device_type, std::optional<torch::ScalarType> dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  torch::DeviceType device_type_;
  bool active_ = false, was_enabled_ = false;
  torch::ScalarType was_dtype_ = torch::kFloat32;
};

}  // namespace tandem::optim
