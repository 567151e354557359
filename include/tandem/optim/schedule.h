// tandem/optim/schedule.h: learning-rate schedules, stepped once per
// optimizer step.
//
// CosineSchedule: linear warmup from base_lr * warmup_start_factor to base_lr
// over `warmup_steps`, then cosine annealing to min_lr at total_steps:
//   lr(t) = min_lr + (base_lr - min_lr) * (1 + cos(pi * (t - w) / (T - w))) / 2
// With warmup_steps = 0 this is PyTorch's CosineAnnealingLR(T_max = T,
// eta_min = min_lr) evaluated per step.
#pragma once

#include <cstdint>

#include <torch/optim/optimizer.h>

namespace tandem::optim {

struct CosineOptions {
  double base_lr = 0.1;
  double min_lr = 0.0;
  int64_t total_steps = 1;
  int64_t warmup_steps = 0;
  double warmup_start_factor = 0.0;
};

class CosineSchedule {
 public:
  explicit CosineSchedule(CosineOptions options);

  // The learning rate for optimizer step `step` (0-based).
  double lr(int64_t step) const;
  // Sets every parameter group's lr for `step`.
  void apply(torch::optim::Optimizer& optimizer, int64_t step) const;
  const CosineOptions& options() const { return options_; }

 private:
  CosineOptions options_;
};

// Sets every parameter group's learning rate (any libtorch optimizer), and
// an optim::Sgd's learning-rate tensor when it has one (optim/sgd.h).
void set_lr(torch::optim::Optimizer& optimizer, double lr);

}  // namespace tandem::optim
