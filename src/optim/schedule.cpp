#include "tandem/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "tandem/optim/sgd.h"
#include "tandem/util/check.h"

namespace tandem::optim {

CosineSchedule::CosineSchedule(CosineOptions options) : options_(options) {
  TANDEM_CHECK(options_.total_steps > 0, "schedule: total steps must be positive, got ",
               options_.total_steps);
  TANDEM_CHECK(options_.warmup_steps >= 0 && options_.warmup_steps < options_.total_steps,
               "schedule: warmup steps must be in [0, ", options_.total_steps, "), got ",
               options_.warmup_steps);
  TANDEM_CHECK(options_.base_lr >= 0 && options_.min_lr >= 0, "schedule: negative learning rate");
}

double CosineSchedule::lr(int64_t step) const {
  const auto& o = options_;
  if (step < o.warmup_steps) {
    double start = o.base_lr * o.warmup_start_factor;
    return start + (o.base_lr - start) * static_cast<double>(step) / o.warmup_steps;
  }
  double progress = static_cast<double>(std::min(step, o.total_steps) - o.warmup_steps) /
                    static_cast<double>(o.total_steps - o.warmup_steps);
  return o.min_lr + (o.base_lr - o.min_lr) * (1.0 + std::cos(M_PI * progress)) / 2.0;
}

void CosineSchedule::apply(torch::optim::Optimizer& optimizer, int64_t step) const {
  set_lr(optimizer, lr(step));
}

void set_lr(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
  // Note [learning rate in a tensor]
  if (auto* sgd = dynamic_cast<Sgd*>(&optimizer)) sgd->refresh_lr_tensor();
}

}  // namespace tandem::optim
