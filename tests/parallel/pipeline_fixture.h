// What the pipeline tests share: a small BatchNorm-free convnet, a
// forward counter, copies, and comparisons of gradients.
#pragma once

#include <gtest/gtest.h>

#include <atomic>

#include <chrono>
#include <random>
#include <set>
#include <thread>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/parallel/model_parallel.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/parallel/stage_split.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace {  // each test file its own copy

using testing::error_of;

using testing::error_of;

inline std::vector<torch::Device> cpus(size_t n) { return std::vector<torch::Device>(n, torch::kCPU); }

// BatchNorm-free, so micro-batches change nothing but rounding.
inline models::Sequence small_convnet() {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("conv1", nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)));
  net->push_back("relu1", nn::ReLU());
  net->push_back("pool", nn::MaxPool2d(2));
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc1", nn::Linear(4 * 4 * 4, 16));
  net->push_back("relu2", nn::ReLU());
  net->push_back("fc2", nn::Linear(16, 5));
  return net;
}

// An identity that counts its forwards (from any stage thread).
struct ForwardCountImpl : torch::nn::Module {
  std::atomic<int> calls{0};
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    return x;
  }
};
TORCH_MODULE(ForwardCount);

inline models::Sequence copy_of(const models::Sequence& net) {
  return std::dynamic_pointer_cast<models::SequenceImpl>(net->clone());
}

inline torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// max |a - b| / max(|b|, 1e-3) over each pair of gradients.
inline void expect_same_gradients(torch::nn::Module& got, torch::nn::Module& want, double tolerance,
                           const std::string& what) {
  auto g = got.named_parameters(), w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].value().grad().defined()) << what << ": " << g[i].key();
    // On the CPU: the two may live on different devices (model parallelism).
    auto diff = (g[i].value().grad().cpu() - w[i].value().grad().cpu()).abs().max().item<double>();
    auto scale = std::max(w[i].value().grad().abs().max().item<double>(), 1e-3);
    EXPECT_LE(diff / scale, tolerance) << what << ": " << g[i].key();
  }
}

struct PipelineCase {
  std::vector<int64_t> sizes;
  int64_t micro_batches;
  std::string schedule;
};

}  // namespace
}  // namespace tandem::parallel
