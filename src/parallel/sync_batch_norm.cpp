#include "tandem/parallel/sync_batch_norm.h"

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

// y = sum over ranks of x; dL/dx = sum over ranks of dL/dy (each rank's y
// feeds that rank's loss, and every y depends on every x).
class AllReduceSum : public torch::autograd::Function<AllReduceSum> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               dist::ProcessGroup* group) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    auto y = x.clone();
    group->all_reduce(y).wait();
    return y;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* group = reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    auto g = grads[0].contiguous().clone();
    group->all_reduce(g).wait();
    return {g, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_reduce_sum_differentiable(const torch::Tensor& tensor, dist::ProcessGroup& group) {
  return AllReduceSum::apply(tensor, &group);
}

SyncBatchNormImpl::SyncBatchNormImpl(SyncBatchNormOptions options,
                                     std::shared_ptr<dist::ProcessGroup> group)
    : options_(options), group_(std::move(group)) {
  TANDEM_CHECK(options_.num_features > 0, "SyncBatchNorm: num_features must be positive, got ",
               options_.num_features);
  reset();
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options_.num_features;
  weight = register_parameter("weight", torch::ones({c}));
  bias = register_parameter("bias", torch::zeros({c}));
  running_mean = register_buffer("running_mean", torch::zeros({c}));
  running_var = register_buffer("running_var", torch::ones({c}));
  num_batches_tracked = register_buffer("num_batches_tracked", torch::zeros({}, torch::kInt64));
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::parallel::SyncBatchNorm(" << options_.num_features << ", eps=" << options_.eps
         << ", momentum=" << options_.momentum << ", ranks="
         << (group_ ? group_->size() : 1) << ")";
}

torch::Tensor SyncBatchNormImpl::forward(const torch::Tensor& input) {
  TANDEM_CHECK(input.dim() >= 2 && input.size(1) == options_.num_features,
               "SyncBatchNorm: expected input [N, ", options_.num_features, ", ...], got ",
               input.sizes());
  if (!is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false,
                             options_.momentum, options_.eps, /*cudnn_enabled=*/true);
  }
  // Per-channel sums over every dimension but the channels, then over ranks.
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  auto x = input.to(torch::kFloat64);
  auto local = torch::cat({x.sum(dims), (x * x).sum(dims)});
  double count = static_cast<double>(input.numel() / options_.num_features);
  if (group_ && group_->size() > 1) {
    local = all_reduce_sum_differentiable(local, *group_);
    auto total = torch::full({1}, count, local.options());  // on the input's device, for NCCL
    group_->all_reduce(total).wait();
    count = total.item<double>();
  }
  TANDEM_CHECK(count > 1, "SyncBatchNorm: expected more than 1 value per channel over all ranks");
  const int64_t c = options_.num_features;
  auto mean = local.slice(0, 0, c) / count;
  auto var = (local.slice(0, c, 2 * c) / count - mean * mean).clamp_min(0);  // biased
  {
    torch::NoGradGuard no_grad;
    running_mean.mul_(1 - options_.momentum).add_(mean.to(running_mean.dtype()), options_.momentum);
    running_var.mul_(1 - options_.momentum)
        .add_((var * (count / (count - 1))).to(running_var.dtype()), options_.momentum);
    num_batches_tracked.add_(1);
  }
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = c;
  auto inv_std = (var + options_.eps).rsqrt().to(input.scalar_type()).view(shape);
  auto centred = input - mean.to(input.scalar_type()).view(shape);
  return centred * inv_std * weight.view(shape) + bias.view(shape);
}

}  // namespace tandem::parallel
