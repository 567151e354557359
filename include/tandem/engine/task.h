// tandem/engine/task.h: what a model is trained to do, as the engine sees
// it: the loss of its outputs against the targets, in training and in
// evaluation, and what counts as a hit. The Trainer, its stage plans and
// evaluate() ask the task; none of them names cross-entropy or argmax.
//
//   classification   outputs [N, classes], targets [N] class indices:
//                    cross-entropy (--label-smoothing in training only),
//                    a hit when the largest output is the target's
//   language model   outputs [B, T, vocab], targets [B, T] next tokens:
//                    cross-entropy over every position, a hit per token
//                    predicted right; losses per token (nats)
//
// Losses and hits count predictions: a row's for classification, each
// token's for a language model. A batch holds targets.numel() of them.
#pragma once

#include <memory>
#include <string>

#include <torch/torch.h>

namespace tandem::parallel {
class TensorParallelPlan;
}

namespace tandem::engine {

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  // Training: the mean loss over the predictions (what backward starts from).
  virtual torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const = 0;
  // Evaluation: the loss summed over the predictions, as a 0-dim tensor.
  virtual torch::Tensor summed_loss(const torch::Tensor& output, const torch::Tensor& target) const = 0;
  // The predictions that were right, as a 0-dim integer tensor.
  virtual torch::Tensor hits(const torch::Tensor& output, const torch::Tensor& target) const = 0;
};

// Image classification (the CNNs); `label_smoothing` in [0, 1) applies to
// the training loss, never to the reported test loss.
std::shared_ptr<const Task> classification_task(double label_smoothing = 0.0);

// Next-token prediction (GPT-2, LLaMA); `label_smoothing` as above.
std::shared_ptr<const Task> language_model_task(double label_smoothing = 0.0);
// The same for a model cut by `plan` (tensor parallelism), whose outputs
// hold this rank's part of the vocabulary: the loss through
// vocab_parallel_cross_entropy and the hits through the argmax over every
// rank's part (collectives of the plan's group), the same figures on every
// rank; once the plan is detached, language_model_task's. `plan` must
// outlive it.
std::shared_ptr<const Task> vocab_parallel_language_model_task(const parallel::TensorParallelPlan& plan,
                                                               double label_smoothing = 0.0);

}  // namespace tandem::engine
