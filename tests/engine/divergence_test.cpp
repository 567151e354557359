// The advice a diverged run ends with (Note [diverged]), and the checks it
// rests on: what the run shows is named, not always the learning rate.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "tandem/engine/divergence.h"

namespace tandem::engine {
namespace {

DivergenceFacts usual() {
  DivergenceFacts f;
  f.lr = 0.1;
  f.peak_lr = 0.1;
  f.weight_decay = 5e-4;
  f.momentum = 0.9;
  f.start_largest = 0.5;
  f.start_tensor = "conv1.weight";
  return f;
}

TEST(DivergenceTest, HugeStartingWeightsAreNamedFirst) {
  auto f = usual();
  f.start_largest = 3e25;
  f.start_tensor = "fc1.weight";
  f.start_source = "--init-weights w.safetensors";
  EXPECT_EQ(divergence_advice(f),
            "the weights were already huge when the run started (|value| up to 3e+25 in 'fc1.weight', from "
            "--init-weights w.safetensors): start from weights that trained well, or from a random initialisation");
  f.start_largest = std::numeric_limits<double>::quiet_NaN();  // NaN weights are huge too
  EXPECT_EQ(divergence_advice(f).rfind("the weights were already huge", 0), 0u);
  f.start_largest = kHugeWeight;  // at the bound: not huge
  EXPECT_EQ(divergence_advice(f).rfind("the learning rate was 0.1", 0), 0u) << divergence_advice(f);
}

// SGD's decay alone: the weights shrink while lr x wd < 2(1 + momentum).
TEST(DivergenceTest, AWeightDecayThatAloneGrowsTheWeightsIsNamed) {
  auto f = usual();
  f.weight_decay = 100;  // lr x wd = 10 > 3.8
  EXPECT_EQ(divergence_advice(f),
            "the weight decay alone makes the weights grow: learning rate 0.1 x --weight-decay 100 = 10, above "
            "the 3.8 (2(1 + momentum)) below which it shrinks them; lower --weight-decay or --lr");
  f.weight_decay = 30;  // 3 < 3.8: shrinks
  EXPECT_EQ(divergence_advice(f).rfind("the learning rate was 0.1", 0), 0u) << divergence_advice(f);
  f.nesterov = true;  // Nesterov's bound: 2(1.9) / 2.8 = 1.357 < 3
  EXPECT_NE(divergence_advice(f).find("above the 1.35714 (2(1 + momentum) / (1 + 2 momentum))"), std::string::npos)
      << divergence_advice(f);
}

// A huge learning rate at a usual decay: the learning rate is the cause,
// the decay's part said beside it; the loss's climb when it was seen.
TEST(DivergenceTest, OtherwiseTheLearningRate) {
  auto f = usual();
  f.lr = f.peak_lr = 10000;
  f.first_loss = 2.3;
  f.last_loss = 1.6e15;
  EXPECT_EQ(divergence_advice(f),
            "the learning rate was 10000 (--lr 10000), at which even the weight decay alone makes the weights "
            "grow (learning rate x --weight-decay = 5, above 2(1 + momentum) = 3.8); the training loss rose from "
            "2.3 to 1.6e+15 before that: train again with a lower --lr, a longer --warmup-epochs or "
            "--clip-grad-norm");
  f = usual();
  EXPECT_EQ(divergence_advice(f),
            "the learning rate was 0.1 (--lr 0.1): train again with a lower --lr, a longer --warmup-epochs or "
            "--clip-grad-norm");
}

TEST(DivergenceTest, NonFiniteTensorsAreCountedAndNamed) {
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<std::pair<std::string, torch::Tensor>> named{
      {"a", torch::tensor({1.0f, -7.0f})},
      {"steps", torch::tensor({int64_t{5}})},  // not floating point: never counted
      {"b", torch::tensor({2.0f, static_cast<float>(inf)})},
      {"c", torch::tensor({static_cast<float>(nan), 1.0f})},
      {"empty", torch::empty({0})},
  };
  std::vector<torch::Tensor> tensors;
  for (const auto& n : named) tensors.push_back(n.second);
  EXPECT_EQ(count_non_finite(tensors, torch::kCPU).item<double>(), 2.0);
  EXPECT_EQ(first_non_finite(named), "b");
  auto [largest, where] = largest_magnitude(named);
  EXPECT_TRUE(std::isnan(largest));
  EXPECT_EQ(where, "c");
  named.erase(named.begin() + 2, named.begin() + 4);
  tensors = {named[0].second};
  EXPECT_EQ(count_non_finite(tensors, torch::kCPU).item<double>(), 0.0);
  EXPECT_EQ(first_non_finite(named), "");
  std::tie(largest, where) = largest_magnitude(named);
  EXPECT_EQ(largest, 7.0);
  EXPECT_EQ(where, "a");
}

// On the device the count stays there (the step reads it with the loss, in
// one copy), and half-precision tensors are counted like float ones.
TEST(DivergenceTest, NonFiniteTensorsAreCountedOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  const auto cuda = torch::Device(torch::kCUDA, 0);
  std::vector<torch::Tensor> tensors{
      torch::tensor({1.0f, -7.0f}).to(cuda),
      torch::tensor({2.0f, inf}).to(cuda).to(torch::kBFloat16),
      torch::tensor({nan, 1.0f}).to(cuda).to(torch::kHalf),
      torch::tensor({int64_t{5}}).to(cuda),
      torch::empty({0}, torch::TensorOptions().device(cuda)),
  };
  auto count = count_non_finite(tensors, cuda);
  EXPECT_TRUE(count.is_cuda());
  EXPECT_EQ(count.item<double>(), 2.0);
  EXPECT_EQ(count_non_finite({tensors[0], tensors[3]}, cuda).item<double>(), 0.0);
  EXPECT_EQ(count_non_finite(tensors, torch::kCPU).item<double>(), 2.0);
  // Tensors on both the CPU and the device (a pipeline rank's model).
  tensors.push_back(torch::tensor({inf}));
  tensors.push_back(torch::tensor({3.0}));
  EXPECT_EQ(count_non_finite(tensors, cuda).item<double>(), 3.0);
  EXPECT_EQ(count_non_finite(tensors, torch::kCPU).item<double>(), 3.0);
}

}  // namespace
}  // namespace tandem::engine
