#include "tandem/engine/divergence.h"

#include <cmath>
#include <limits>
#include <map>

#include <ATen/ATen.h>

#include "tandem/util/table.h"

namespace tandem::engine {

std::string divergence_advice(const DivergenceFacts& f) {
  // Weights that were already huge: no learning rate trains from them.
  if (!(f.start_largest <= kHugeWeight)) {
    return format("the weights were already huge when the run started (|value| up to %g in '%s', from %s): "
                  "start from weights that trained well, or from a random initialisation",
                  f.start_largest, f.start_tensor.c_str(),
                  f.start_source.empty() ? "the initialisation" : f.start_source.c_str());
  }
  // SGD's weight decay alone moves the weights by lr x wd x w a step; with
  // momentum m the weights shrink only while lr x wd < 2(1 + m) (Nesterov:
  // 2(1 + m) / (1 + 2m)), beyond which they grow whatever the data. The
  // decay is named as the cause when it is itself out of the ordinary
  // (above kLargeWeightDecay); past the bound at a usual decay, the
  // learning rate is, and the decay's part is said beside it.
  const double decay = f.lr * f.weight_decay;
  const double bound = f.nesterov ? 2 * (1 + f.momentum) / (1 + 2 * f.momentum) : 2 * (1 + f.momentum);
  const bool decay_grows = f.momentum < 1 && decay > bound;
  const std::string bound_text = f.nesterov ? "2(1 + momentum) / (1 + 2 momentum)" : "2(1 + momentum)";
  if (decay_grows && f.weight_decay > kLargeWeightDecay) {
    return format("the weight decay alone makes the weights grow: learning rate %g x --weight-decay %g = %g, "
                  "above the %g (%s) below which it shrinks them; lower --weight-decay or --lr",
                  f.lr, f.weight_decay, decay, bound, bound_text.c_str());
  }
  std::string why;
  if (decay_grows) {
    why = format(", at which even the weight decay alone makes the weights grow (learning rate x --weight-decay "
                 "= %g, above %s = %g)", decay, bound_text.c_str(), bound);
  }
  if (std::isfinite(f.first_loss) && std::isfinite(f.last_loss) && f.last_loss > f.first_loss) {
    why += format("; the training loss rose from %.4g to %.4g before that", f.first_loss, f.last_loss);
  }
  return format("the learning rate was %g (--lr %g)%s: train again with a lower --lr, a longer "
                "--warmup-epochs or --clip-grad-norm",
                f.lr, f.peak_lr, why.c_str());
}

std::pair<double, std::string> largest_magnitude(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  double largest = 0.0;
  std::string name;
  torch::NoGradGuard no_grad;
  for (const auto& [key, t] : tensors) {
    if (!t.defined() || !t.is_floating_point() || t.numel() == 0) continue;
    const double value = at::linalg_vector_norm(t.detach(), std::numeric_limits<double>::infinity(),
                                                   std::nullopt, false, std::nullopt)
                             .item<double>();  // NaN propagates
    if (std::isnan(value) || value > largest) {
      largest = std::isnan(value) ? std::numeric_limits<double>::quiet_NaN() : value;
      name = key;
      if (std::isnan(value)) break;
    }
  }
  return {largest, name};
}

torch::Tensor count_non_finite(const std::vector<torch::Tensor>& tensors, const torch::Device& device) {
  torch::NoGradGuard no_grad;
  // Per device, then one count per device moved to `device`: a rank may
  // hold tensors on two (a pipeline rank keeps the stages it does not run
  // on the CPU), and one copy per device, not per tensor, leaves it.
  std::map<std::string, std::vector<torch::Tensor>> largest;
  for (const auto& t : tensors) {
    if (t.defined() && t.is_floating_point() && t.numel() > 0) {
      // The infinity norm: the largest magnitude, without a copy of |t|;
      // inf and NaN survive it.
      largest[t.device().str()].push_back(at::linalg_vector_norm(t.detach(), std::numeric_limits<double>::infinity(),
                                                                 std::nullopt, false, std::nullopt)
                                              .to(torch::kFloat64));
    }
  }
  auto count = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  for (const auto& [where, norms] : largest) count += torch::stack(norms).isfinite().logical_not().sum().to(count.options());
  return count;
}

std::string first_non_finite(const std::vector<std::pair<std::string, torch::Tensor>>& tensors) {
  torch::NoGradGuard no_grad;
  for (const auto& [key, t] : tensors) {
    if (t.defined() && t.is_floating_point() && t.numel() > 0 && !t.isfinite().all().item<bool>()) return key;
  }
  return "";
}

}  // namespace tandem::engine
