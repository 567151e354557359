#include "tandem/optim/sgd.h"

#include <map>
#include <tuple>

#include <ATen/ops/_foreach_add.h>
#include <ATen/ops/_foreach_mul.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::optim {

namespace {

// Parameters (with a gradient) of one device and dtype: the unit a foreach
// kernel takes.
struct Slice {
  std::vector<torch::Tensor> params, grads;
  std::vector<torch::Tensor> buffers;  // undefined: made this step (the parameter's first)
};

}  // namespace

torch::Tensor Sgd::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const torch::optim::SGDOptions&>(group.options());
    const double momentum = options.momentum(), weight_decay = options.weight_decay();
    std::map<std::tuple<int, int, int>, Slice> slices;  // (device type, index, dtype)
    for (auto& p : group.params()) {
      if (!p.grad().defined() || !steps_parameter(p)) continue;
      auto key = std::make_tuple(static_cast<int>(p.device().type()), static_cast<int>(p.device().index()),
                                 static_cast<int>(p.scalar_type()));
      auto& slice = slices[key];
      slice.params.push_back(p);
      slice.grads.push_back(p.grad());
      if (momentum == 0) continue;
      auto found = state_.find(p.unsafeGetTensorImpl());
      if (found == state_.end()) {
        TANDEM_CHECK(!frozen_, "optim::Sgd: a parameter has no momentum buffer yet, and the state is "
                     "frozen (a CUDA graph is being captured); every parameter needs one eager step "
                     "with a gradient first");
        slice.buffers.emplace_back();
      } else {
        slice.buffers.push_back(
            static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer());
      }
    }
    for (auto& [key, slice] : slices) {
      std::vector<torch::Tensor> d = weight_decay != 0
                                         ? at::_foreach_add(slice.grads, slice.params, weight_decay)
                                         : slice.grads;
      if (momentum != 0) {
        // Old buffers decay and take d; new ones start as d (libtorch's rule).
        std::vector<torch::Tensor> old_buffers, old_d;
        for (size_t i = 0; i < slice.params.size(); ++i) {
          if (!slice.buffers[i].defined()) {
            auto buffer = torch::clone(d[i]).detach();
            auto state = std::make_unique<torch::optim::SGDParamState>();
            state->momentum_buffer(buffer);
            state_[slice.params[i].unsafeGetTensorImpl()] = std::move(state);
            slice.buffers[i] = buffer;
          } else {
            old_buffers.push_back(slice.buffers[i]);
            old_d.push_back(d[i]);
          }
        }
        if (!old_buffers.empty()) {
          at::_foreach_mul_(old_buffers, momentum);
          at::_foreach_add_(old_buffers, old_d, 1 - options.dampening());
        }
        d = options.nesterov() ? at::_foreach_add(d, slice.buffers, momentum) : slice.buffers;
      }
      if (neg_lr_.defined()) {  // Note [learning rate in a tensor]
        at::_foreach_add_(slice.params, at::_foreach_mul(d, neg_lr_));
      } else {
        at::_foreach_add_(slice.params, d, -options.lr());
      }
    }
  }
  return loss;
}

void Sgd::use_lr_tensor() {
  // The foreach kernels read the scalar tensor in the parameters' dtype.
  std::optional<torch::TensorOptions> kind;
  for (const auto& group : param_groups_) {
    for (const auto& p : group.params()) {
      TANDEM_CHECK(!kind || (kind->device() == p.device() && kind->dtype() == p.dtype()),
                   "optim::Sgd::use_lr_tensor: parameters of ", kind->dtype(), " on ", kind->device(),
                   " and of ", p.dtype(), " on ", p.device(), "; a learning-rate tensor needs one "
                   "device and dtype");
      kind = p.options();
    }
  }
  TANDEM_CHECK(kind, "optim::Sgd::use_lr_tensor: no parameters");
  neg_lr_ = torch::zeros({}, kind->requires_grad(false));
  refresh_lr_tensor();
}

void Sgd::refresh_lr_tensor() {
  if (!neg_lr_.defined() || param_groups_.empty()) return;
  double lr = param_groups_.front().options().get_lr();
  for (const auto& group : param_groups_) {
    TANDEM_CHECK(group.options().get_lr() == lr, "optim::Sgd: parameter groups with different "
                 "learning rates cannot share one learning-rate tensor");
  }
  torch::NoGradGuard no_grad;
  neg_lr_.fill_(-lr);
}

}  // namespace tandem::optim
