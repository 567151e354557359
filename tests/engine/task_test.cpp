// The classification task (engine/task.h) against libtorch's own
// cross-entropy: label smoothing in the training loss only; evaluation of
// short windows in forwards of many, and bf16 logits scored in float32
// (engine/evaluate.h).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include <torch/torch.h>

#include "tandem/data/source.h"
#include "tandem/engine/evaluate.h"
#include "tandem/engine/task.h"
#include "tandem/models/registry.h"
#include "testing.h"

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

// About `bytes` of repetitive text in `dir`, as windows of `seq_len`.
data::DataSplits river_text(const testing::TempDir& dir, size_t bytes, int64_t seq_len) {
  std::string text;
  for (int i = 0; text.size() < bytes; ++i) text += "the river " + std::to_string(i % 97) + " and the stone. ";
  std::ofstream(dir.file("t.txt")) << text;
  data::DataOptions options;
  options.seq_len = seq_len;
  return data::open_data("text:" + dir.file("t.txt"), options);
}

models::Sequence gpt2_tiny(int64_t seq_len) {
  models::ModelOptions options;
  options.vocab_size = 256;
  options.seq_len = seq_len;
  return models::make_seeded_model("gpt2-tiny", options, 5);
}

// Note [evaluation batches of tokens]: one-token windows asked for 8 at a
// time are evaluated at least 2,048 tokens a forward (3,788 forwards of 8
// took 15.8 s, 84% of it OpenMP's fork and join), with the loss and
// accuracy of any grouping.
TEST(EvaluateTest, ShortWindowsAreEvaluatedManyAForward) {
  testing::TempDir dir;
  const auto splits = river_text(dir, 40000, 1);
  auto model = gpt2_tiny(1);
  model->to(torch::kFloat64);
  int64_t forwards = 0;
  const Forward counted = [&](const torch::Tensor& x) {
    ++forwards;
    return model->forward(x);
  };
  const auto task = language_model_task();
  const auto windows = splits.test->size();
  ASSERT_GT(windows, 3000);
  const auto small = evaluate(model, *splits.test, 8, torch::kCPU, 0, nullptr, counted, task.get());
  EXPECT_EQ(forwards, (windows + 2047) / 2048);
  forwards = 0;
  const auto whole = evaluate(model, *splits.test, windows, torch::kCPU, 0, nullptr, counted, task.get());
  EXPECT_EQ(forwards, 1);
  EXPECT_NEAR(small.loss, whole.loss, 1e-12 * whole.loss);
  EXPECT_EQ(small.accuracy, whole.accuracy);
  EXPECT_EQ(small.count, windows);
}

// Under --amp a forward gives bf16 logits: they are scored in float32, as
// autocast runs the training loss. A bf16 sum of a test set's losses kept
// about 3 digits (4.8889 for 4.8724); the control scores them in bf16.
TEST(EvaluateTest, HalfPrecisionLogitsAreScoredInFloat32) {
  testing::TempDir dir;
  const auto splits = river_text(dir, 20000, 16);
  auto model = gpt2_tiny(16);
  const Forward in_bf16 = [&](const torch::Tensor& x) { return model->forward(x).to(torch::kBFloat16); };
  const auto task = language_model_task();
  const auto scored = evaluate(model, *splits.test, 64, torch::kCPU, 0, nullptr, in_bf16, task.get());
  // The reference: the same bf16 logits, scored in float64.
  double sum = 0;
  int64_t tokens = 0;
  torch::NoGradGuard no_grad;
  model->eval();
  std::vector<int64_t> all(static_cast<size_t>(splits.test->size()));
  for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int64_t>(i);
  const auto batch = splits.test->get_batch(all, 0);
  const auto logits = in_bf16(batch.inputs).to(torch::kFloat64);
  sum = torch::nn::functional::cross_entropy(logits.flatten(0, 1), batch.targets.reshape({-1}),
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
            .item<double>();
  tokens = batch.targets.numel();
  EXPECT_NEAR(scored.loss, sum / double(tokens), 1e-6 * scored.loss);
  // The control: the same sum in bf16 is off by far more.
  const auto half = in_bf16(batch.inputs);
  const double in_half = task->summed_loss(half, batch.targets).item<double>() / double(tokens);
  const double in_full = task->summed_loss(half.to(torch::kFloat32), batch.targets).item<double>() / double(tokens);
  EXPECT_GT(std::abs(in_half - in_full), 1e3 * 1e-6 * in_full);
}

}  // namespace
}  // namespace tandem::engine
