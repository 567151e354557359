// What the FSDP tests share: a small net (optionally with BatchNorm or
// nested sequences), its data, and units of a least size.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>

#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "tandem/optim/clip.h"
#include "tandem/optim/sgd.h"
#include "tandem/parallel/ddp.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace {  // each test file its own copy

using testing::copy_parameters;
using testing::error_of;
using testing::expect_no_errors;
using testing::run_ranks;

inline models::Sequence make_net(bool batch_norm = false, bool nested = false) {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("conv", nn::Conv2d(nn::Conv2dOptions(2, 4, 3).padding(1)));
  if (batch_norm) net->push_back("bn", nn::BatchNorm2d(4));
  net->push_back("relu1", nn::ReLU(nn::ReLUOptions(/*inplace=*/true)));
  net->push_back("flatten", nn::Flatten());
  models::Sequence head;
  auto& tail = nested ? head : net;
  tail->push_back("fc1", nn::Linear(4 * 5 * 5, 16));
  tail->push_back("relu2", nn::ReLU(nn::ReLUOptions(/*inplace=*/true)));
  tail->push_back("fc2", nn::Linear(16, 3));
  if (nested) net->push_back("head", head);
  net->to(torch::kFloat64);
  return net;
}


inline FsdpOptions units_of_at_least(int64_t parameters) {
  FsdpOptions options;
  options.min_unit_numel = parameters;
  return options;
}

constexpr int kSteps = 4;
constexpr int64_t kBatch = 12;

struct Data {
  torch::Tensor inputs, targets;
};
inline Data make_data() {
  torch::manual_seed(0);
  return {torch::randn({kSteps * kBatch, 2, 5, 5}, torch::kFloat64),
          torch::randint(0, 3, {kSteps * kBatch}, torch::kInt64)};
}

torch::optim::SGDOptions sgd_options() { return torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-3); }

// One step of `world` ranks' share of batch `s` (one process: world 1).
inline void train_step(torch::optim::Optimizer& optimizer, const std::function<torch::Tensor(const torch::Tensor&)>& forward,
                const std::function<void()>& after, const Data& data, int s, int64_t rank, int64_t world) {
  optimizer.zero_grad();
  const int64_t per_rank = kBatch / world, begin = s * kBatch + rank * per_rank;
  torch::nn::functional::cross_entropy(forward(data.inputs.slice(0, begin, begin + per_rank)),
                                       data.targets.slice(0, begin, begin + per_rank))
      .backward();
  after();
  optimizer.step();
}

// One process, whole batches: the reference weights.

}  // namespace
}  // namespace tandem::parallel
