// Activation checkpointing (Note [activation checkpointing]) against the
// same model without it: the same outputs, gradients and BatchNorm
// statistics bit for bit (float64, and under CPU bf16 autocast), each
// checkpointed segment run once more in backward, and a lower peak of CPU
// memory, measured by a counting allocator.
#include <gtest/gtest.h>

#include <ATen/autocast_mode.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>

#include "tandem/models/activation_checkpoint.h"
#include "tandem/models/registry.h"
#include "tandem/models/sequence.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::models {
namespace {

using testing::error_of;

TEST(PlanSegmentsTest, AsEvenAsPossibleTheFirstOnesLonger) {
  EXPECT_EQ(plan_segments(12, 3), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_EQ(plan_segments(12, 5), (std::vector<int64_t>{3, 3, 2, 2, 2}));
  EXPECT_EQ(plan_segments(3, 3), (std::vector<int64_t>{1, 1, 1}));
  EXPECT_EQ(plan_segments(7, 1), (std::vector<int64_t>{7}));
  EXPECT_NE(error_of([] { plan_segments(3, 4); }).find("expected 1 to 3 segments (the model's top-level "
                                                       "layers), got 4"), std::string::npos);
  EXPECT_NE(error_of([] { plan_segments(3, 0); }).find("got 0"), std::string::npos);
}

struct Step {
  torch::Tensor output;
  std::vector<torch::Tensor> grads, buffers;
};

// One training forward and backward of `net` on a fixed batch.
Step train_step(Sequence net, const torch::Tensor& x, const torch::Tensor& y) {
  net->train();
  net->zero_grad();
  Step step;
  step.output = net->forward(x);
  torch::nn::functional::cross_entropy(step.output, y).backward();
  for (const auto& p : net->parameters()) step.grads.push_back(p.grad().clone());
  for (const auto& b : net->buffers()) step.buffers.push_back(b.clone());
  return step;
}

void expect_same(const Step& a, const Step& b, const std::string& what) {
  EXPECT_TRUE(torch::equal(a.output, b.output)) << what;
  ASSERT_EQ(a.grads.size(), b.grads.size());
  for (size_t i = 0; i < a.grads.size(); ++i) EXPECT_TRUE(torch::equal(a.grads[i], b.grads[i])) << what << ", gradient " << i;
  ASSERT_EQ(a.buffers.size(), b.buffers.size());
  for (size_t i = 0; i < a.buffers.size(); ++i) EXPECT_TRUE(torch::equal(a.buffers[i], b.buffers[i])) << what << ", buffer " << i;
}

Sequence convnet(torch::Dtype dtype) {
  torch::manual_seed(5);
  ModelOptions o;
  o.in_channels = 1;
  o.image_size = 16;
  o.num_classes = 10;
  auto net = make_model("convnet", o);
  net->to(dtype);
  return net;
}

TEST(ActivationCheckpointTest, TheStepIsTheUncheckpointedOneBitForBit) {
  auto x = torch::randn({8, 1, 16, 16}, torch::kFloat64);
  auto y = torch::randint(0, 10, {8}, torch::kInt64);
  for (int segments : {2, 3, 12}) {
    auto plain = convnet(torch::kFloat64);
    auto checkpointed = convnet(torch::kFloat64);
    checkpointed->checkpoint_segments(plan_segments(static_cast<int64_t>(checkpointed->size()), segments));
    for (int step = 0; step < 2; ++step) {  // BatchNorm's statistics once per step, not twice
      expect_same(train_step(plain, x, y), train_step(checkpointed, x, y),
                  std::to_string(segments) + " segments, step " + std::to_string(step));
    }
    // A clone keeps the segments; evaluation and no-grad forwards run plainly.
    auto copy = std::dynamic_pointer_cast<SequenceImpl>(checkpointed->clone());
    EXPECT_EQ(copy->checkpointed_segments(), checkpointed->checkpointed_segments());
  }
}

// Autocast's settings of the forward are those of the recomputation
// (backward runs outside the forward's autocast scope; recomputing in
// float32 would give other gradients).
TEST(ActivationCheckpointTest, TheRecomputationRunsUnderTheForwardsAutocast) {
  auto x = torch::randn({8, 1, 16, 16});
  auto y = torch::randint(0, 10, {8}, torch::kInt64);
  auto plain = convnet(torch::kFloat32), checkpointed = convnet(torch::kFloat32);
  checkpointed->checkpoint_segments(plan_segments(static_cast<int64_t>(checkpointed->size()), 3));
  auto step_under_bf16 = [&](Sequence net) {
    net->train();
    net->zero_grad();
    Step step;
    {
      at::autocast::set_autocast_enabled(c10::DeviceType::CPU, true);
      at::autocast::set_autocast_dtype(c10::DeviceType::CPU, at::kBFloat16);
      at::autocast::increment_nesting();
      step.output = net->forward(x);
      if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
      at::autocast::set_autocast_enabled(c10::DeviceType::CPU, false);
    }
    torch::nn::functional::cross_entropy(step.output.to(torch::kFloat32), y).backward();
    for (const auto& p : net->parameters()) step.grads.push_back(p.grad().clone());
    for (const auto& b : net->buffers()) step.buffers.push_back(b.clone());
    return step;
  };
  auto a = step_under_bf16(plain), b = step_under_bf16(checkpointed);
  EXPECT_EQ(a.output.scalar_type(), torch::kBFloat16);
  expect_same(a, b, "bf16 autocast");
}

// Counts the forwards of the module it wraps (an identity).
struct CountImpl : torch::nn::Module {
  int calls = 0;
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    return x;
  }
};
TORCH_MODULE(Count);

TEST(ActivationCheckpointTest, EachCheckpointedSegmentRunsOnceMoreInBackward) {
  Sequence net;
  Count first, last;
  net->push_back("count1", first);
  net->push_back("fc1", torch::nn::Linear(4, 4));
  net->push_back("count2", last);
  net->push_back("fc2", torch::nn::Linear(4, 2));
  net->checkpoint_segments({2, 2});
  auto x = torch::randn({3, 4});
  net->forward(x).sum().backward();
  EXPECT_EQ(first->calls, 2);  // forward, and again in backward
  EXPECT_EQ(last->calls, 1);   // the last segment keeps its activations
  {
    torch::NoGradGuard no_grad;
    net->forward(x);
  }
  net->eval();
  net->forward(x);
  EXPECT_EQ(first->calls, 4);  // no recomputation without a graph or in evaluation
  EXPECT_NE(error_of([&] { net->checkpoint_segments({2, 1}); }).find("segments of 3 layers for a sequence of 4"),
            std::string::npos);
}

TEST(ActivationCheckpointTest, ThePeakOfMemoryIsLower) {
  // 16 layers of 512 x 512 with tanh (which keeps its output) on 512 rows:
  // each activation is 1 MiB, and without checkpointing backward starts with
  // the 16 tanh outputs alive (19 MiB above the model, measured); with 4
  // segments, 3 segment inputs and one segment's activations at a time
  // (11 MiB).
  auto build = [] {
    torch::manual_seed(2);
    Sequence net;
    for (int i = 0; i < 16; ++i) {
      net->push_back("fc" + std::to_string(i), torch::nn::Linear(512, 512));
      net->push_back("tanh" + std::to_string(i), torch::nn::Tanh());
    }
    return net;
  };
  auto x = torch::randn({512, 512});
  auto* base = c10::GetCPUAllocator();
  testing::CountingAllocator counting(base);
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  auto peak_of = [&](Sequence net) {
    counting.reset_peak();
    const int64_t before = counting.live();
    net->forward(x).sum().backward();
    return counting.peak() - before;
  };
  auto plain = build(), checkpointed = build();
  checkpointed->checkpoint_segments(plan_segments(32, 4));
  peak_of(plain);  // warm: the gradients exist from now on in both
  peak_of(checkpointed);
  const int64_t without = peak_of(plain), with = peak_of(checkpointed);
  c10::SetCPUAllocator(base, /*priority=*/100);
  std::printf("peak above the model: %.1f MiB without checkpointing, %.1f MiB with 4 segments\n",
              without / 1048576.0, with / 1048576.0);
  EXPECT_LT(with, without * 7 / 10);
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    EXPECT_TRUE(torch::allclose(plain->parameters()[i].grad(), checkpointed->parameters()[i].grad()));
  }
}

}  // namespace
}  // namespace tandem::models
