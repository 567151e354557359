#include "tandem/optim/adamw.h"

#include <cmath>
#include <map>
#include <tuple>

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_addcdiv.h>
#include <ATen/ops/_foreach_addcmul.h>
#include <ATen/ops/_foreach_div.h>
#include <ATen/ops/_foreach_lerp.h>
#include <ATen/ops/_foreach_maximum.h>
#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_sqrt.h>
#include <ATen/ops/_fused_adamw.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::optim {

namespace {

// Parameters (with a gradient) of one device and dtype: the unit a foreach
// or fused kernel takes.
struct AdamWSlice {
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<torch::optim::AdamWParamState*> states;
  bool cuda = false;
};

void check_options(const torch::optim::AdamWOptions& o) {
  const auto [beta1, beta2] = o.betas();
  TANDEM_CHECK(o.lr() >= 0, "AdamW: the learning rate must be non-negative, got ", o.lr());
  TANDEM_CHECK(o.eps() >= 0, "AdamW: eps must be non-negative, got ", o.eps());
  TANDEM_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, "AdamW: the betas must be in [0, 1), got (",
               beta1, ", ", beta2, ")");
  TANDEM_CHECK(o.weight_decay() >= 0, "AdamW: weight decay must be non-negative, got ", o.weight_decay());
}

}  // namespace

AdamW::AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
             AdamWKernel kernel)
    : torch::optim::AdamW(groups, defaults), kernel_(kernel) {
  for (const auto& group : param_groups_) {
    check_options(static_cast<const torch::optim::AdamWOptions&>(group.options()));
  }
}

AdamW::AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults, AdamWKernel kernel)
    : AdamW(std::vector<torch::optim::OptimizerParamGroup>{torch::optim::OptimizerParamGroup(std::move(params))},
            defaults, kernel) {}

torch::Tensor AdamW::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    const auto [beta1, beta2] = o.betas();
    const double lr = o.lr(), weight_decay = o.weight_decay(), eps = o.eps();
    std::map<std::tuple<int, int, int>, AdamWSlice> slices;  // (device type, index, dtype)
    for (auto& p : group.params()) {
      if (!p.grad().defined() || !steps_parameter(p)) continue;
      TANDEM_CHECK(!p.grad().is_sparse(), "AdamW does not support sparse gradients");
      auto& entry = state_[p.unsafeGetTensorImpl()];
      if (!entry) {  // PyTorch's lazy state: zeros like the parameter, step 0
        auto state = std::make_unique<torch::optim::AdamWParamState>();
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        if (o.amsgrad()) state->max_exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        entry = std::move(state);
      }
      auto& state = static_cast<torch::optim::AdamWParamState&>(*entry);
      TANDEM_CHECK(!o.amsgrad() || state.max_exp_avg_sq().defined(),
                   "AdamW: amsgrad is on but a parameter's state has no max_exp_avg_sq (a checkpoint "
                   "written without amsgrad)");
      auto key = std::make_tuple(static_cast<int>(p.device().type()), static_cast<int>(p.device().index()),
                                 static_cast<int>(p.scalar_type()));
      auto& slice = slices[key];
      slice.cuda = p.is_cuda();
      slice.params.push_back(p);
      slice.grads.push_back(p.grad());
      slice.exp_avgs.push_back(state.exp_avg());
      slice.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (o.amsgrad()) slice.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      slice.states.push_back(&state);
    }
    for (auto& [key, slice] : slices) {
      const bool fused = kernel_ == AdamWKernel::fused || (kernel_ == AdamWKernel::automatic && slice.cuda);
      if (fused) {
        // PyTorch's fused path: the step tensors counted up first, then the
        // kernel reads them.
        std::vector<torch::Tensor> steps, fresh;
        for (size_t i = 0; i < slice.params.size(); ++i) {
          auto& cached = step_tensors_[slice.params[i].unsafeGetTensorImpl()];
          const int64_t step = slice.states[i]->step();
          if (cached.step != step || !cached.tensor.defined() ||
              cached.tensor.device() != slice.params[i].device()) {
            cached.tensor = torch::full({}, static_cast<double>(step),
                                        torch::TensorOptions().dtype(torch::kFloat32).device(slice.params[i].device()));
          }
          cached.step = step + 1;
          slice.states[i]->step(step + 1);
          steps.push_back(cached.tensor);
        }
        at::_foreach_add_(steps, 1);
        at::_fused_adamw_(slice.params, slice.grads, slice.exp_avgs, slice.exp_avg_sqs, slice.max_exp_avg_sqs,
                          steps, lr, beta1, beta2, weight_decay, eps, o.amsgrad(), /*maximize=*/false);
        continue;
      }
      // torch.optim.AdamW's foreach path, line for line (its single-tensor
      // path does the same arithmetic per tensor).
      if (weight_decay != 0) at::_foreach_mul_(slice.params, 1 - lr * weight_decay);
      at::_foreach_lerp_(slice.exp_avgs, slice.grads, 1 - beta1);
      at::_foreach_mul_(slice.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(slice.exp_avg_sqs, slice.grads, slice.grads, 1 - beta2);
      std::vector<c10::Scalar> step_size, bias_correction2_sqrt;
      for (auto* state : slice.states) {
        state->step(state->step() + 1);
        const double t = static_cast<double>(state->step());
        const double bias_correction1 = 1 - std::pow(beta1, t);
        const double bias_correction2 = 1 - std::pow(beta2, t);
        step_size.emplace_back((lr / bias_correction1) * -1);
        bias_correction2_sqrt.emplace_back(std::pow(bias_correction2, 0.5));  // Python's bc ** 0.5
      }
      std::vector<torch::Tensor> denom;
      if (o.amsgrad()) {
        at::_foreach_maximum_(slice.max_exp_avg_sqs, slice.exp_avg_sqs);
        denom = at::_foreach_sqrt(slice.max_exp_avg_sqs);
      } else {
        denom = at::_foreach_sqrt(slice.exp_avg_sqs);
      }
      at::_foreach_div_(denom, bias_correction2_sqrt);
      at::_foreach_add_(denom, eps);
      at::_foreach_addcdiv_(slice.params, slice.exp_avgs, denom, step_size);
    }
  }
  return loss;
}

std::vector<torch::optim::OptimizerParamGroup> decay_groups(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const torch::optim::AdamWOptions& options) {
  std::vector<torch::Tensor> params;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& item : named_parameters) {
    if (!item.value().requires_grad()) continue;
    params.push_back(item.value());
    shapes.push_back(item.value().sizes().vec());
  }
  return decay_groups(params, shapes, options);
}

std::vector<torch::optim::OptimizerParamGroup> decay_groups(const std::vector<torch::Tensor>& params,
                                                            const std::vector<std::vector<int64_t>>& shapes,
                                                            const torch::optim::AdamWOptions& options) {
  TANDEM_CHECK(params.size() == shapes.size(), "decay_groups: ", params.size(), " parameters, ", shapes.size(),
               " shapes");
  std::vector<torch::Tensor> decayed, plain;
  for (size_t i = 0; i < params.size(); ++i) (shapes[i].size() >= 2 ? decayed : plain).push_back(params[i]);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(decayed, std::make_unique<torch::optim::AdamWOptions>(options));
  }
  if (!plain.empty()) {
    auto without = std::make_unique<torch::optim::AdamWOptions>(options);
    without->weight_decay(0);
    groups.emplace_back(plain, std::move(without));
  }
  return groups;
}

}  // namespace tandem::optim
