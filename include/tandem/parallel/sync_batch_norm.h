// tandem/parallel/sync_batch_norm.h: BatchNorm over the batch of all ranks.
//
// In training, SyncBatchNorm normalises with the mean and variance of the
// whole global batch: every rank contributes the per-channel sum, sum of
// squares and count of its part, all-reduced (differentiably: the backward
// pass all-reduces the gradients of those sums, because every rank's output
// depends on every rank's input). So W ranks with batch B each compute what
// one process computes on W * B, up to summation order; this is what makes a
// run's result independent of the number of ranks (--sync-bn). In eval mode
// it uses the running statistics, like BatchNorm. Parameter and buffer names
// are BatchNorm2d's (weight, bias, running_mean, running_var,
// num_batches_tracked), so checkpoints and exported weights are interchangeable.
//
// Statistics are reduced in float64 (variance = E[x^2] - mean^2 would lose
// digits in float32); the running variance is updated with the unbiased
// estimate, as torch's BatchNorm does.
#pragma once

#include <memory>

#include <torch/nn.h>

#include "tandem/dist/process_group.h"

namespace tandem::parallel {

struct SyncBatchNormOptions {
  int64_t num_features = 0;
  double eps = 1e-5;
  double momentum = 0.1;
};

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // `group` may be null: then the statistics are this process's own.
  SyncBatchNormImpl(SyncBatchNormOptions options, std::shared_ptr<dist::ProcessGroup> group);

  torch::Tensor forward(const torch::Tensor& input);
  void reset() override;
  // From now on this process's own statistics (a copy measured on one rank
  // alone must not wait for the others).
  void use_local_statistics() { group_ = nullptr; }
  void pretty_print(std::ostream& stream) const override;

  torch::Tensor weight, bias, running_mean, running_var, num_batches_tracked;

 private:
  SyncBatchNormOptions options_;
  std::shared_ptr<dist::ProcessGroup> group_;
};
TORCH_MODULE(SyncBatchNorm);

// Sums `tensor` over the ranks of `group`, as an autograd operation whose
// backward sums the incoming gradients over the ranks.
torch::Tensor all_reduce_sum_differentiable(const torch::Tensor& tensor, dist::ProcessGroup& group);

}  // namespace tandem::parallel
