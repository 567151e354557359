// The tasks a model is trained for (engine/task.h).
#include "tandem/engine/task.h"

namespace tandem::engine {
namespace {

namespace F = torch::nn::functional;

class ClassificationTask : public Task {
 public:
  explicit ClassificationTask(double label_smoothing)
      : training_(F::CrossEntropyFuncOptions().label_smoothing(label_smoothing)) {}
  std::string name() const override { return "classification"; }
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return F::cross_entropy(output, target, training_);
  }
  torch::Tensor summed_loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return F::cross_entropy(output, target, F::CrossEntropyFuncOptions().reduction(torch::kSum));
  }
  torch::Tensor hits(const torch::Tensor& output, const torch::Tensor& target) const override {
    return output.argmax(1).eq(target).sum();
  }

 private:
  F::CrossEntropyFuncOptions training_;
};

// Every position of [B, T, vocab] a row of classification's [N, vocab].
class LanguageModelTask : public Task {
 public:
  explicit LanguageModelTask(double label_smoothing) : rows_(label_smoothing) {}
  std::string name() const override { return "language model"; }
  torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return rows_.loss(flat(output), target.reshape(-1));
  }
  torch::Tensor summed_loss(const torch::Tensor& output, const torch::Tensor& target) const override {
    return rows_.summed_loss(flat(output), target.reshape(-1));
  }
  torch::Tensor hits(const torch::Tensor& output, const torch::Tensor& target) const override {
    return output.argmax(-1).eq(target).sum();
  }

 private:
  static torch::Tensor flat(const torch::Tensor& output) { return output.reshape({-1, output.size(-1)}); }
  ClassificationTask rows_;
};

}  // namespace

std::shared_ptr<const Task> language_model_task(double label_smoothing) {
  return std::make_shared<LanguageModelTask>(label_smoothing);
}

std::shared_ptr<const Task> classification_task(double label_smoothing) {
  return std::make_shared<ClassificationTask>(label_smoothing);
}

}  // namespace tandem::engine
