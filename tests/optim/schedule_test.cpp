#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/optim/schedule.h"
#include "tandem/util/check.h"

namespace tandem::optim {

// PyTorch: CosineAnnealingLR(SGD(lr=0.1), T_max=10, eta_min=0.001), lr before
// each of 11 steps (computed with the pinned torch 2.11 wheel).
TEST(CosineScheduleTest, MatchesPyTorchCosineAnnealingLR) {
  const double expected[] = {0.1, 0.09757729755661011, 0.0905463412215599, 0.07959536998847742,
                             0.0657963412215599, 0.0505, 0.03520365877844011, 0.02140463001152259,
                             0.010453658778440109, 0.0034227024433899004, 0.001};
  CosineSchedule schedule({/*base_lr=*/0.1, /*min_lr=*/0.001, /*total_steps=*/10});
  for (int step = 0; step <= 10; ++step) {
    EXPECT_NEAR(schedule.lr(step), expected[step], 1e-12) << "step " << step;
  }
}

TEST(CosineScheduleTest, LinearWarmupThenCosine) {
  CosineSchedule schedule({/*base_lr=*/1.0, /*min_lr=*/0.0, /*total_steps=*/14,
                           /*warmup_steps=*/4, /*warmup_start_factor=*/0.0});
  EXPECT_DOUBLE_EQ(schedule.lr(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.lr(2), 0.5);
  EXPECT_DOUBLE_EQ(schedule.lr(4), 1.0);
  EXPECT_NEAR(schedule.lr(9), 0.5, 1e-12);  // halfway through the cosine part
  EXPECT_NEAR(schedule.lr(14), 0.0, 1e-12);
  EXPECT_NEAR(schedule.lr(20), 0.0, 1e-12);  // clamped past the end
}

TEST(CosineScheduleTest, AppliesToEveryParameterGroup) {
  auto a = torch::zeros({1}, torch::requires_grad());
  auto b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD sgd({torch::optim::OptimizerParamGroup({a}),
                         torch::optim::OptimizerParamGroup({b})},
                        torch::optim::SGDOptions(0.5));
  CosineSchedule({/*base_lr=*/0.2, 0.0, 4}).apply(sgd, 0);
  for (auto& group : sgd.param_groups()) EXPECT_DOUBLE_EQ(group.options().get_lr(), 0.2);
}

TEST(CosineScheduleTest, RejectsBadSettings) {
  EXPECT_THROW(CosineSchedule({0.1, 0.0, /*total_steps=*/0}), Error);
  EXPECT_THROW(CosineSchedule({0.1, 0.0, 10, /*warmup_steps=*/10}), Error);
}

}  // namespace tandem::optim
