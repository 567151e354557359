// Tensor parallelism's layers and its cross-entropy (tensor_parallel.h).
#include <torch/torch.h>

#include "tandem/parallel/tensor_parallel.h"
#include "tandem/util/check.h"

namespace tandem::parallel::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void check_group(const std::shared_ptr<dist::ProcessGroup>& group, const char* what) {
  TANDEM_CHECK(group != nullptr, what, ": a tensor-parallel group is required");
}

// Note [tensor-parallel shards]: a copy, a parameter of its own.
torch::Tensor copied(const torch::Tensor& t) { return t.detach().clone().contiguous(); }

}  // namespace

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& weight_, const torch::Tensor& bias_,
                                                   std::shared_ptr<dist::ProcessGroup> group,
                                                   TensorParallelOptions options)
    : ColumnParallelLinearImpl(
          weight_, bias_,
          [&] {
            check_group(group, "ColumnParallelLinear");
            const auto part = part_of(weight_.size(0), group->rank(), group->size());
            return torch::arange(part.begin, part.end, torch::TensorOptions().dtype(torch::kInt64));
          }(),
          group, options) {}

ColumnParallelLinearImpl::ColumnParallelLinearImpl(const torch::Tensor& weight_, const torch::Tensor& bias_,
                                                   const torch::Tensor& rows, std::shared_ptr<dist::ProcessGroup> group,
                                                   TensorParallelOptions options)
    : group_(std::move(group)), options_(options) {
  check_group(group_, "ColumnParallelLinear");
  TANDEM_CHECK(weight_.dim() == 2, "ColumnParallelLinear: a weight of [out, in] is expected, got ", weight_.sizes());
  TANDEM_CHECK(!bias_.defined() || (bias_.dim() == 1 && bias_.size(0) == weight_.size(0)),
               "ColumnParallelLinear: a bias of [", weight_.size(0), "] is expected");
  TANDEM_CHECK(!options_.gather_output || weight_.size(0) % group_->size() == 0, "ColumnParallelLinear: ",
               weight_.size(0), " output features cannot be gathered from ", group_->size(), " equal parts");
  auto index = rows.to(weight_.device());
  weight = register_parameter("weight", copied(weight_.index_select(0, index)));
  if (bias_.defined()) bias = register_parameter("bias", copied(bias_.index_select(0, index)));
}

torch::Tensor ColumnParallelLinearImpl::forward(const torch::Tensor& x) {
  auto input = options_.sequence_parallel ? gather_sequence(x, *group_, 1) : copy_to(x, *group_);
  auto y = torch::linear(input, weight, bias);
  return options_.gather_output ? gather_last(y, *group_) : y;
}

RowParallelLinearImpl::RowParallelLinearImpl(const torch::Tensor& weight_, const torch::Tensor& bias_,
                                             std::shared_ptr<dist::ProcessGroup> group, TensorParallelOptions options)
    : group_(std::move(group)), options_(options) {
  check_group(group_, "RowParallelLinear");
  TANDEM_CHECK(weight_.dim() == 2, "RowParallelLinear: a weight of [out, in] is expected, got ", weight_.sizes());
  TANDEM_CHECK(!bias_.defined() || (bias_.dim() == 1 && bias_.size(0) == weight_.size(0)),
               "RowParallelLinear: a bias of [", weight_.size(0), "] is expected");
  const auto part = part_of(weight_.size(1), group_->rank(), group_->size());
  weight = register_parameter("weight", copied(weight_.narrow(1, part.begin, part.size())));
  if (bias_.defined()) bias = register_parameter("bias", copied(bias_));
}

torch::Tensor RowParallelLinearImpl::forward(const torch::Tensor& x) {
  auto partial = torch::linear(x, weight);
  auto y = options_.sequence_parallel ? reduce_scatter_sequence(partial, *group_, 1) : reduce_from(partial, *group_);
  return bias.defined() ? y + bias : y;  // once, after the sum
}

VocabParallelEmbeddingImpl::VocabParallelEmbeddingImpl(const torch::Tensor& weight_,
                                                       std::shared_ptr<dist::ProcessGroup> group,
                                                       TensorParallelOptions options)
    : group_(std::move(group)), options_(options) {
  check_group(group_, "VocabParallelEmbedding");
  TANDEM_CHECK(weight_.dim() == 2, "VocabParallelEmbedding: a weight of [vocabulary, dim] is expected, got ",
               weight_.sizes());
  vocabulary_ = part_of(weight_.size(0), group_->rank(), group_->size());
  weight = register_parameter("weight", copied(weight_.narrow(0, vocabulary_.begin, vocabulary_.size())));
}

torch::Tensor VocabParallelEmbeddingImpl::forward(const torch::Tensor& tokens) {
  const auto elsewhere = (tokens < vocabulary_.begin).logical_or(tokens >= vocabulary_.end);
  const auto local = (tokens - vocabulary_.begin).masked_fill(elsewhere, 0);
  auto out = torch::embedding(weight, local).masked_fill(elsewhere.unsqueeze(-1), 0);
  return options_.sequence_parallel ? reduce_scatter_sequence(out, *group_, 1) : reduce_from(out, *group_);
}

namespace {

// Note [vocabulary-parallel cross-entropy]: with s = z - max(z) over the
// whole row, -log p_t = log(sum_j e^s_j) - s_t, and smoothing's mean of
// -log p_j is log(sum e^s) - mean_j s_j. Each rank holds some columns of
// s: the row's max goes in one all-reduce, then the three per-row sums (of
// e^s, of s, and s_t from the rank that holds t) in a second. The gradient
// is local: p_j - (1 - eps) [j = t] - eps / V, times the loss's gradient.
struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& logits, const torch::Tensor& targets,
                               int64_t begin, int64_t end, int64_t vocab_size, dist::ProcessGroup* group,
                               double smoothing) {
    torch::NoGradGuard no_grad;
    const bool low = logits.scalar_type() == torch::kHalf || logits.scalar_type() == torch::kBFloat16;
    auto z = low ? logits.to(torch::kFloat32) : logits;
    auto max = std::get<0>(z.max(-1)).contiguous();
    if (group->size() > 1) group->all_reduce(max, dist::ReduceOp::kMax).wait();
    auto s = z - max.unsqueeze(-1);
    const auto mine = (targets >= begin).logical_and(targets < end);
    const auto local = (targets - begin).masked_fill(mine.logical_not(), 0);
    auto target_logit = s.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(mine.logical_not(), 0);
    auto e = s.exp();
    auto sums = torch::stack({e.sum(-1), target_logit, s.sum(-1)}).contiguous();
    if (group->size() > 1) group->all_reduce(sums).wait();
    auto log_sum = sums[0].log();
    auto loss = log_sum - sums[1];
    if (smoothing > 0) loss = (1 - smoothing) * loss + smoothing * (log_sum - sums[2] / static_cast<double>(vocab_size));
    ctx->save_for_backward({e / sums[0].unsqueeze(-1), local, mine});
    ctx->saved_data["smoothing"] = smoothing;
    ctx->saved_data["vocab"] = vocab_size;
    // float32 for half logits, as autocast runs cross_entropy: the fp16
    // scaler multiplies the loss by 2^16, past half's largest number.
    return loss;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const double smoothing = ctx->saved_data["smoothing"].toDouble();
    const auto vocab = ctx->saved_data["vocab"].toInt();
    const auto& softmax = saved[0];
    auto g = grads[0].to(softmax.scalar_type()).unsqueeze(-1);
    auto grad = softmax.clone();
    if (smoothing > 0) grad.sub_(smoothing / static_cast<double>(vocab));
    auto hit = saved[2].to(softmax.scalar_type()).unsqueeze(-1) * -(1 - smoothing);
    grad.scatter_add_(-1, saved[1].unsqueeze(-1), hit);
    grad.mul_(g);
    return {grad, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           const Part& vocabulary, int64_t vocab_size, dist::ProcessGroup& group,
                                           double label_smoothing) {
  TANDEM_CHECK(logits.dim() >= 1 && logits.size(-1) == vocabulary.size(), "vocab_parallel_cross_entropy: logits of ",
               logits.sizes(), " for a part of ", vocabulary.size(), " classes");
  TANDEM_CHECK(targets.sizes() == logits.sizes().slice(0, logits.dim() - 1), "vocab_parallel_cross_entropy: targets of ",
               targets.sizes(), " for logits of ", logits.sizes());
  TANDEM_CHECK(label_smoothing >= 0 && label_smoothing <= 1, "vocab_parallel_cross_entropy: label smoothing in [0, 1] "
               "is expected, got ", label_smoothing);
  return VocabParallelCrossEntropy::apply(logits, targets, vocabulary.begin, vocabulary.end, vocab_size, &group,
                                          label_smoothing);
}

}  // namespace tandem::parallel::tp
