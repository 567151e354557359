// The language-model task over a vocabulary cut by tensor parallelism
// (engine/task.h; parallel/tensor_parallel_plan.h).
#include <limits>

#include "tandem/engine/task.h"
#include "tandem/parallel/tensor_parallel_plan.h"

namespace tandem::engine {
namespace {

class VocabParallelLanguageModelTask : public Task {
 public:
  VocabParallelLanguageModelTask(const parallel::TensorParallelPlan& plan, double label_smoothing)
      : plan_(plan), smoothing_(label_smoothing), whole_(language_model_task(label_smoothing)) {}
  std::string name() const override { return "language model"; }
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    if (plan_.detached()) return whole_->loss(output, target);
    return losses(output, target, smoothing_).mean();
  }
  torch::Tensor summed_loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    if (plan_.detached()) return whole_->summed_loss(output, target);
    return losses(output, target, 0).sum();
  }
  // The first class of the largest output over every rank's part, as
  // argmax picks: the largest value, then the smallest index holding it.
  torch::Tensor hits(const torch::Tensor& output, const torch::Tensor& target) const override {
    if (plan_.detached()) return whole_->hits(output, target);
    torch::NoGradGuard no_grad;
    auto [largest, at] = output.max(-1);
    auto global = largest.contiguous().clone();
    auto& group = plan_.group();
    if (group.size() > 1) group.all_reduce(global, dist::ReduceOp::kMax).wait();
    auto index = (at + plan_.vocabulary().begin)
                     .masked_fill(largest.ne(global), std::numeric_limits<int64_t>::max())
                     .contiguous();
    if (group.size() > 1) group.all_reduce(index, dist::ReduceOp::kMin).wait();
    return index.eq(target).sum();
  }

 private:
  torch::Tensor losses(const torch::Tensor& output, const torch::Tensor& target, double smoothing) const {
    return parallel::tp::vocab_parallel_cross_entropy(output, target, plan_.vocabulary(), plan_.vocab_size(),
                                                      plan_.group(), smoothing);
  }
  const parallel::TensorParallelPlan& plan_;
  double smoothing_;
  std::shared_ptr<const Task> whole_;
};

}  // namespace

std::shared_ptr<const Task> vocab_parallel_language_model_task(const parallel::TensorParallelPlan& plan,
                                                               double label_smoothing) {
  return std::make_shared<VocabParallelLanguageModelTask>(plan, label_smoothing);
}

}  // namespace tandem::engine
