#include "tandem/optim/grad_scaler.h"

#include <map>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale.h>
#include <ATen/ops/_amp_update_scale.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::optim {

GradScaler::GradScaler(GradScalerOptions options, std::shared_ptr<dist::ProcessGroup> group)
    : options_(options), group_(std::move(group)) {
  TANDEM_CHECK(options_.init_scale > 0, "grad scaler: the initial scale must be positive, got ",
               options_.init_scale);
  TANDEM_CHECK(options_.growth_factor > 1, "grad scaler: growth_factor must be > 1, got ",
               options_.growth_factor);
  TANDEM_CHECK(options_.backoff_factor > 0 && options_.backoff_factor < 1,
               "grad scaler: backoff_factor must be in (0, 1), got ", options_.backoff_factor);
  TANDEM_CHECK(options_.growth_interval >= 1, "grad scaler: growth_interval must be >= 1, got ",
               options_.growth_interval);
  scale_ = torch::full({1}, options_.init_scale, torch::kFloat32);
  growth_tracker_ = torch::zeros({1}, torch::kInt32);
  found_inf_ = torch::zeros({1}, torch::kFloat32);
}

void GradScaler::place(const torch::Device& device) {
  if (scale_.device() == device) return;
  scale_ = scale_.to(device);
  growth_tracker_ = growth_tracker_.to(device);
  found_inf_ = found_inf_.to(device);
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) {
  place(loss.device());
  return loss * scale_.to(loss.scalar_type());
}

void GradScaler::unscale(torch::optim::Optimizer& optimizer) {
  TANDEM_CHECK(!unscaled_, "grad scaler: unscale() already ran this step (call update() after "
                           "each step)");
  // As torch.amp.GradScaler: the reciprocal in double, then float.
  auto inv_scale = scale_.to(torch::kFloat64).reciprocal().to(torch::kFloat32);
  std::map<std::string, std::vector<torch::Tensor>> by_device;  // the kernel takes one device
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      if (p.grad().defined()) by_device[p.grad().device().str()].push_back(p.grad());
    }
  }
  found_inf_.zero_();
  for (auto& [name, grads] : by_device) {
    torch::Device device(name);
    auto found = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    {
      torch::NoGradGuard no_grad;
      at::_amp_foreach_non_finite_check_and_unscale_(grads, found, inv_scale.to(device));
    }
    found_inf_.add_(found.to(found_inf_.device()));
  }
  if (group_ && group_->size() > 1) {  // Note [found-inf across ranks]
    // On the group's device: a pipeline stage that never scaled a loss (all
    // but the last) keeps its found-inf flag on the CPU.
    auto flag = found_inf_.to(group_->wire_device(), /*non_blocking=*/false, /*copy=*/true);
    group_->all_reduce(flag, dist::ReduceOp::kMax).wait();
    found_inf_.copy_(flag);
  }
  found_inf_.clamp_max_(1.0);
  unscaled_ = true;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!unscaled_) unscale(optimizer);
  if (found_inf_.item<float>() != 0) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  at::_amp_update_scale_(scale_, growth_tracker_, found_inf_, options_.growth_factor,
                         options_.backoff_factor, options_.growth_interval);
  found_inf_.zero_();
  unscaled_ = false;
}

double GradScaler::get_scale() const { return scale_.item<double>(); }
int64_t GradScaler::growth_tracker() const { return growth_tracker_.item<int64_t>(); }

void GradScaler::load_state(double scale, int64_t growth_tracker) {
  TANDEM_CHECK(scale > 0, "grad scaler: a saved scale must be positive, got ", scale);
  scale_.fill_(scale);
  growth_tracker_.fill_(growth_tracker);
}

}  // namespace tandem::optim
