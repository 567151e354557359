// The classification task (engine/task.h) against libtorch's own
// cross-entropy: label smoothing in the training loss only.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "tandem/engine/task.h"

namespace tandem::engine {
namespace {

namespace F = torch::nn::functional;

TEST(TaskTest, ClassificationSmoothsTheTrainingLossOnly) {
  torch::manual_seed(3);
  auto output = torch::randn({6, 4}, torch::kFloat64);
  auto target = torch::tensor({0, 3, 1, 1, 2, 0}, torch::kInt64);
  auto task = classification_task(0.1);
  EXPECT_EQ(task->name(), "classification");
  const double smoothed = F::cross_entropy(output, target, F::CrossEntropyFuncOptions().label_smoothing(0.1)).item<double>();
  const double plain = F::cross_entropy(output, target).item<double>();
  ASSERT_GT(std::abs(smoothed - plain), 1e-3);  // the two differ: the checks below tell them apart
  EXPECT_DOUBLE_EQ(task->loss(output, target).item<double>(), smoothed);
  EXPECT_NEAR(task->summed_loss(output, target).item<double>(), 6 * plain, 1e-12);
  auto predicted = output.argmax(1);
  EXPECT_EQ(task->hits(output, target).item<int64_t>(), predicted.eq(target).sum().item<int64_t>());
  EXPECT_EQ(task->hits(output, predicted).item<int64_t>(), 6);
}

}  // namespace
}  // namespace tandem::engine
