#include "tandem/optim/clip.h"

#include <algorithm>
#include <cmath>

#include <ATen/ops/_foreach_mul.h>
#include <ATen/ops/_foreach_norm.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::optim {

torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                             dist::ProcessGroup* sharded_over, const std::vector<torch::Tensor>& also_scaled) {
  std::vector<torch::Tensor> counted, scaled;
  for (const auto& p : parameters) {
    if (p.grad().defined()) counted.push_back(p.grad());
  }
  for (const auto& p : also_scaled) {
    if (p.grad().defined()) scaled.push_back(p.grad());
  }
  return clip_gradients(counted, max_norm, sharded_over, scaled);
}

torch::Tensor clip_gradients(const std::vector<torch::Tensor>& counted, double max_norm,
                             dist::ProcessGroup* sharded_over, const std::vector<torch::Tensor>& also_scaled) {
  TANDEM_CHECK(std::isfinite(max_norm) && max_norm > 0,
               "clip_grad_norm: expected a positive finite max_norm, got ", max_norm);
  // Gradients of one device and dtype: one foreach call each.
  struct Group {
    torch::Device device;
    torch::ScalarType dtype;
    std::vector<torch::Tensor> grads;
  };
  std::vector<Group> groups;
  for (const auto& grad : counted) {
    if (!grad.defined()) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const Group& g) {
      return g.device == grad.device() && g.dtype == grad.scalar_type();
    });
    if (it == groups.end()) it = groups.insert(groups.end(), Group{grad.device(), grad.scalar_type(), {}});
    it->grads.push_back(grad);
  }
  const bool sharded = sharded_over != nullptr && sharded_over->size() > 1;
  if (groups.empty() && !sharded) return torch::zeros({});

  // A rank with no gradients (a pipeline stage of parameter-free layers)
  // still joins the collective, on the group's device.
  const torch::Device first = !groups.empty() ? groups.front().device
                              : sharded      ? sharded_over->wire_device()
                                             : torch::Device(torch::kCPU);
  std::vector<torch::Tensor> partial;  // each group's norm, on the first device
  for (const auto& g : groups) {
    partial.push_back(torch::linalg_vector_norm(torch::stack(at::_foreach_norm(g.grads, 2)), 2).to(first));
  }
  torch::Tensor total;
  if (partial.empty()) {
    // Only gradients counted elsewhere (a rank whose pieces are all
    // replicas): the norm in their dtype, so their coefficient is not
    // rounded to float32's.
    auto dtype = torch::kFloat32;
    for (const auto& grad : also_scaled) {
      if (grad.defined()) {
        dtype = grad.scalar_type();
        break;
      }
    }
    total = torch::zeros({}, torch::TensorOptions().device(first).dtype(dtype));
  } else {
    total = partial.size() == 1 ? partial.front() : torch::linalg_vector_norm(torch::stack(partial), 2);
  }
  if (sharded) {  // the whole gradient's norm from every rank's part (a collective)
    // In float64 on every rank: a rank without gradients has no dtype of
    // its own, and the ranks' sizes must agree.
    auto squares = (total * total).to(torch::kFloat64).reshape({1});
    sharded_over->all_reduce(squares).wait();
    total = squares.reshape({}).sqrt().to(total.scalar_type());
  }
  auto coefficient = (max_norm / (total + 1e-6)).clamp_max(1.0);
  for (auto& g : groups) at::_foreach_mul_(g.grads, coefficient.to(g.device));
  for (const auto& grad : also_scaled) {
    if (grad.defined()) grad.mul_(coefficient.to(grad.device()));
  }
  return total;
}

}  // namespace tandem::optim
