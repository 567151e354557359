// Mixed precision on the CPU: the gradient scaler's arithmetic (against
// values worked out by hand from torch.amp.GradScaler's rules), the skip on
// inf/NaN agreed across ranks, and autocast's guard and its reach into
// tandem's threads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <torch/torch.h>

#include "tandem/models/sequence.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/grad_scaler.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::optim {
namespace {

using testing::error_of;

struct OneWeight {
  torch::Tensor w = torch::tensor({1.0f, 2.0f}, torch::requires_grad());
  torch::optim::SGD sgd{std::vector<torch::Tensor>{w}, torch::optim::SGDOptions(0.5)};
};

// The loss is scaled; step() unscales the gradient exactly and steps.
TEST(GradScalerTest, ScalesTheLossAndUnscalesTheGradients) {
  OneWeight m;
  GradScaler scaler({/*init_scale=*/1024.0});
  auto loss = (m.w * m.w).sum();  // gradient 2w = (2, 4)
  auto scaled = scaler.scale(loss);
  EXPECT_FLOAT_EQ(scaled.item<float>(), 1024.0f * 5.0f);
  scaled.backward();
  EXPECT_TRUE(torch::equal(m.w.grad(), torch::tensor({2048.0f, 4096.0f})));
  EXPECT_TRUE(scaler.step(m.sgd));
  EXPECT_TRUE(torch::equal(m.w.grad(), torch::tensor({2.0f, 4.0f})));
  EXPECT_TRUE(torch::equal(m.w.detach(), torch::tensor({0.0f, 0.0f})));  // w - 0.5 * 2w
  scaler.update();
  EXPECT_EQ(scaler.get_scale(), 1024.0);
  EXPECT_EQ(scaler.growth_tracker(), 1);
}

// An inf or NaN gradient: no step, the scale halves, the run of clean steps
// starts again; growth_interval clean steps double it.
TEST(GradScalerTest, BacksOffOnInfAndGrowsAfterAnIntervalOfCleanSteps) {
  OneWeight m;
  GradScaler scaler({/*init_scale=*/8.0, /*growth_factor=*/2.0, /*backoff_factor=*/0.5,
                     /*growth_interval=*/3});
  // Steps: clean, clean, inf, clean, clean, clean, NaN, clean.
  const std::vector<double> bad = {0, 0, 1, 0, 0, 0, 2, 0};
  const std::vector<double> scale_after = {8, 8, 4, 4, 4, 8, 4, 4};
  const std::vector<int64_t> tracker_after = {1, 2, 0, 1, 2, 0, 0, 1};
  for (size_t i = 0; i < bad.size(); ++i) {
    m.sgd.zero_grad();
    auto before = m.w.detach().clone();
    auto loss = (m.w * 0.01f).sum();
    if (bad[i] == 1) loss = loss * std::numeric_limits<float>::infinity();
    if (bad[i] == 2) loss = loss * std::numeric_limits<float>::quiet_NaN();
    scaler.scale(loss).backward();
    bool stepped = scaler.step(m.sgd);
    EXPECT_EQ(stepped, bad[i] == 0) << "step " << i;
    if (!stepped) EXPECT_TRUE(torch::equal(m.w.detach(), before)) << "step " << i;
    scaler.update();
    EXPECT_EQ(scaler.get_scale(), scale_after[i]) << "step " << i;
    EXPECT_EQ(scaler.growth_tracker(), tracker_after[i]) << "step " << i;
  }
}

TEST(GradScalerTest, StateRoundTripsAndBadOptionsAreNamed) {
  GradScaler scaler;
  EXPECT_EQ(scaler.get_scale(), 65536.0);  // PyTorch's defaults
  scaler.load_state(512.0, 7);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(scaler.growth_tracker(), 7);
  EXPECT_NE(error_of([] { GradScaler({/*init_scale=*/0.0}); }).find("initial scale must be positive"),
            std::string::npos);
  EXPECT_NE(error_of([] { GradScaler({1.0, 2.0, /*backoff_factor=*/1.5}); }).find("backoff_factor"),
            std::string::npos);
  OneWeight m;
  (m.w * 1.0f).sum().backward();
  scaler.unscale(m.sgd);
  EXPECT_NE(error_of([&] { scaler.unscale(m.sgd); }).find("unscale() already ran this step"),
            std::string::npos);
}

// Note [found-inf across ranks]: only rank 1's gradient overflows, yet both
// ranks skip the step and keep equal scales.
TEST(GradScalerTest, RanksSkipTogether) {
  std::vector<double> scales(2);
  std::vector<int> stepped(2);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    OneWeight m;
    GradScaler scaler({/*init_scale=*/4.0}, group);
    auto loss = m.w.sum();
    if (group->rank() == 1) loss = loss * std::numeric_limits<float>::infinity();
    scaler.scale(loss).backward();
    stepped[group->rank()] = scaler.step(m.sgd);
    scaler.update();
    scales[group->rank()] = scaler.get_scale();
  }));
  EXPECT_EQ(stepped, (std::vector<int>{0, 0}));
  EXPECT_EQ(scales, (std::vector<double>{2.0, 2.0}));
}

// --- autocast ----------------------------------------------------------------

TEST(AutocastTest, GuardLowersMatrixProductsAndRestores) {
  auto a = torch::randn({4, 4}), b = torch::randn({4, 4});
  {
    AutocastGuard outer(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    // Losses stay in float32 (autocast's own lists).
    auto logits = torch::mm(a, b);
    auto loss = torch::nn::functional::cross_entropy(logits, torch::tensor({0, 1, 2, 3}));
    EXPECT_EQ(loss.scalar_type(), torch::kFloat32);
    {
      AutocastGuard inner(torch::kCPU, torch::kHalf);
      EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kHalf);
    }
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
    AutocastGuard off(torch::kCPU, std::nullopt);  // "off" changes nothing
    EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(torch::mm(a, b).scalar_type(), torch::kFloat32);
  EXPECT_EQ(parse_amp("off"), std::nullopt);
  EXPECT_EQ(parse_amp("bf16"), torch::kBFloat16);
  EXPECT_EQ(parse_amp("fp16"), torch::kHalf);
  EXPECT_NE(error_of([] { parse_amp("fp8"); }).find("--amp: expected off, bf16 or fp16, got 'fp8'"),
            std::string::npos);
}

// Autocast is per thread: DataParallel's replica threads and the pipeline's
// stage threads run under their caller's.
TEST(AutocastTest, ReachesReplicaAndStageThreads) {
  models::Sequence net;
  net->push_back("fc1", torch::nn::Linear(6, 8));
  net->push_back("fc2", torch::nn::Linear(8, 3));
  std::vector<torch::Device> cpus(2, torch::kCPU);
  parallel::DataParallel dp(net, parallel::DataParallelOptions{cpus});
  auto x = torch::randn({8, 6});
  {
    AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    EXPECT_EQ(dp->forward(x).scalar_type(), torch::kBFloat16);
    parallel::Pipeline pipe(net, {1, 1}, cpus, {2, "gpipe"});
    auto step = pipe.train_step(x, torch::randint(3, {8}, torch::kInt64),
                                [](const torch::Tensor& out, const torch::Tensor& target) {
                                  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
                                  return torch::nn::functional::cross_entropy(out, target);
                                });
    EXPECT_EQ(step.output.scalar_type(), torch::kBFloat16);
  }
  EXPECT_EQ(dp->forward(x).scalar_type(), torch::kFloat32);
}

// fp16 autocast with the scaler trains: the loss of a small model falls.
TEST(AutocastTest, Fp16WithTheScalerTrains) {
  torch::manual_seed(0);
  torch::nn::Linear model(10, 3);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.5));
  GradScaler scaler;
  auto x = torch::randn({64, 10});
  auto y = (x.narrow(1, 0, 3)).argmax(1);
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    sgd.zero_grad();
    torch::Tensor loss;
    {
      AutocastGuard autocast(torch::kCPU, torch::kHalf);
      loss = torch::nn::functional::cross_entropy(model->forward(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(sgd);
    scaler.update();
    (step == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, 0.5 * first);
}

}  // namespace
}  // namespace tandem::optim
