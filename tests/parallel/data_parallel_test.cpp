// DataParallel and its primitives on repeated CPU devices (cpu,cpu,...):
// outputs, gradients and training steps equal one device's, replicas kept,
// buffers as PyTorch's DataParallel keeps them, errors naming the replica.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <set>
#include <thread>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include "tandem/models/sequence.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace data_parallel_test {  // the file's own names (a layer's tests compile as one unit)

std::vector<torch::Device> cpus(size_t n) { return std::vector<torch::Device>(n, torch::kCPU); }

// A BatchNorm-free model: outputs and gradients can match one device.
models::Sequence mlp() {
  models::Sequence net;
  net->push_back("fc1", torch::nn::Linear(6, 16));
  net->push_back("relu", torch::nn::ReLU());
  net->push_back("fc2", torch::nn::Linear(16, 3));
  return net;
}

models::Sequence copy_of(const models::Sequence& net) {
  return std::dynamic_pointer_cast<models::SequenceImpl>(net->clone());
}

TEST(DataParallelTest, ScatterSizesAreAsEvenAsPossible) {
  EXPECT_EQ(scatter_sizes(10, 3), (std::vector<int64_t>{4, 3, 3}));
  EXPECT_EQ(scatter_sizes(8, 4), (std::vector<int64_t>{2, 2, 2, 2}));
  EXPECT_EQ(scatter_sizes(2, 4), (std::vector<int64_t>{1, 1}));  // fewer rows than devices
  EXPECT_EQ(scatter_sizes(0, 2), (std::vector<int64_t>{}));
}

TEST(DataParallelTest, ScatterAndGatherAreDifferentiableInverses) {
  auto x = torch::randn({7, 3}, torch::requires_grad());
  auto pieces = scatter(x, cpus(3));
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_EQ(pieces[0].size(0), 3);
  EXPECT_EQ(pieces[2].size(0), 2);
  std::vector<torch::Tensor> doubled;
  for (auto& p : pieces) doubled.push_back(p * 2);
  auto y = gather(doubled, torch::kCPU);
  EXPECT_TRUE(torch::equal(y, x * 2));
  y.sum().backward();
  EXPECT_TRUE(torch::equal(x.grad(), torch::full({7, 3}, 2.0f)));
}

// Three SGD steps through DataParallel on `devices` (all the same device)
// equal three on that device alone, outputs and gradients included.
void expect_training_equals_one_device(const std::vector<torch::Device>& devices, double rtol, double atol) {
  torch::manual_seed(0);
  auto net = mlp();
  net->to(devices[0]);
  auto single = copy_of(net);
  DataParallel dp(net, DataParallelOptions{devices});
  EXPECT_EQ(dp->named_parameters().keys()[0], "module.fc1.weight");  // PyTorch's names
  torch::optim::SGD sgd_dp(dp->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD sgd_one(single->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({10, 6}).to(devices[0]);
    auto y = torch::randint(0, 3, {10}, torch::kInt64).to(devices[0]);
    sgd_dp.zero_grad();
    sgd_one.zero_grad();
    auto out_dp = dp->forward(x);
    auto out_one = single->forward(x);
    EXPECT_TRUE(torch::allclose(out_dp, out_one, rtol, atol)) << "step " << step << " on " << devices[0];
    torch::nn::functional::cross_entropy(out_dp, y).backward();
    torch::nn::functional::cross_entropy(out_one, y).backward();
    auto a = net->parameters(), b = single->parameters();
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_TRUE(a[i].grad().defined()) << "parameter " << i;
      EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), rtol, atol))
          << "gradient " << i << " at step " << step << " on " << devices[0] << ", max difference "
          << (a[i].grad() - b[i].grad()).abs().max().item<double>();
    }
    sgd_dp.step();
    sgd_one.step();
  }
}

TEST(DataParallelTest, TrainingEqualsOneDevice) { expect_training_equals_one_device(cpus(3), 1e-5, 1e-6); }

// cuda:0,cuda:0: other batch sizes for the same kernels, so within 1e-4.
TEST(DataParallelTest, TrainingOnOneGpuTwiceEqualsOneDevice) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  expect_training_equals_one_device({torch::Device(torch::kCUDA, 0), torch::Device(torch::kCUDA, 0)}, 1e-4, 1e-5);
}

// Note [kept replicas]: the same replica tensors serve every call, refreshed
// with the original's current values.
TEST(DataParallelTest, ReplicasAreKeptAndRefreshed) {
  auto net = mlp();
  ReplicaSet set(torch::nn::AnyModule(net), cpus(2));
  auto first = set.refresh(2)[1].ptr()->parameters()[0];
  {
    torch::NoGradGuard no_grad;
    net->parameters()[0].add_(1.0);
  }
  auto second = set.refresh(2)[1].ptr()->parameters()[0];
  EXPECT_EQ(first.data_ptr(), second.data_ptr());
  EXPECT_TRUE(torch::equal(second, net->parameters()[0]));
  EXPECT_NE(second.data_ptr(), net->parameters()[0].data_ptr());  // a copy, not the original
}

// PyTorch's buffer semantics: running statistics come from the first
// replica's share of the batch; every replica normalises its own share.
TEST(DataParallelTest, BatchNormStatisticsComeFromTheFirstReplica) {
  models::Sequence net;
  net->push_back("bn", torch::nn::BatchNorm1d(4));
  auto reference = torch::nn::BatchNorm1d(4);
  DataParallel dp(net, DataParallelOptions{cpus(2)});
  auto x = torch::randn({8, 4}) * 3 + 1;
  auto out = dp->forward(x);
  reference->forward(x.slice(0, 0, 4));
  auto bn = net->named_buffers();
  EXPECT_TRUE(torch::allclose(bn["bn.running_mean"], reference->running_mean));
  EXPECT_TRUE(torch::allclose(bn["bn.running_var"], reference->running_var));
  auto second_half = x.slice(0, 4, 8);
  auto normalised = (second_half - second_half.mean(0)) / torch::sqrt(second_half.var(0, false) + 1e-5);
  EXPECT_TRUE(torch::allclose(out.slice(0, 4, 8), normalised, 1e-4, 1e-5));
}

// Seed 003: only one block of a model is data parallel.
TEST(DataParallelTest, WrappingOneSubmoduleTrainsLikeTheWholeModel) {
  torch::manual_seed(1);
  models::Sequence block2;
  block2->push_back("fc", torch::nn::Linear(8, 8));
  block2->push_back("relu", torch::nn::ReLU());
  models::Sequence net;
  net->push_back("block1", torch::nn::Linear(6, 8));
  net->push_back("block2", DataParallel(block2, DataParallelOptions{cpus(2)}));
  net->push_back("block3", torch::nn::Linear(8, 3));
  models::Sequence plain;
  plain->push_back("block1", torch::nn::Linear(6, 8));
  plain->push_back("block2", copy_of(block2));
  plain->push_back("block3", torch::nn::Linear(8, 3));
  {
    torch::NoGradGuard no_grad;
    auto a = net->parameters(), b = plain->parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) b[i].copy_(a[i]);
  }
  auto x = torch::randn({5, 6});
  net->forward(x).pow(2).sum().backward();
  plain->forward(x).pow(2).sum().backward();
  auto a = net->parameters(), b = plain->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::allclose(a[i].grad(), b[i].grad(), 1e-5, 1e-6)) << "parameter " << i;
  }
}

struct FailOnNegativeImpl : torch::nn::Cloneable<FailOnNegativeImpl> {
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    TANDEM_CHECK(x.min().item<float>() >= 0, "negative input");
    return x;
  }
};
TORCH_MODULE(FailOnNegative);

TEST(DataParallelTest, AReplicasExceptionNamesItsDevice) {
  DataParallel dp(FailOnNegative(), DataParallelOptions{cpus(2)});
  auto x = torch::ones({4, 2});
  x[3][0] = -1;  // in the second replica's share
  EXPECT_EQ(testing::error_of([&] { dp->forward(x); }), "replica 1 on cpu failed: negative input");
}

// A replica's whole message comes through, its later lines too, and a
// libtorch error without libtorch's stack trace (util/message.h).
struct FailInTwoWaysImpl : torch::nn::Cloneable<FailInTwoWaysImpl> {
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    TANDEM_CHECK(x.min().item<float>() >= 0, "negative input\nat row ", x.argmin().item<int64_t>() / x.size(1));
    return x.matmul(torch::ones({3, 3}));  // x has 2 columns: libtorch refuses
  }
};
TORCH_MODULE(FailInTwoWays);

TEST(DataParallelTest, AReplicasWholeMessageComesThroughWithoutLibtorchsTrace) {
  DataParallel dp(FailInTwoWays(), DataParallelOptions{cpus(2)});
  auto x = torch::ones({4, 2});
  x[1][0] = -1;  // in the first replica's share (the second fails on the product)
  EXPECT_EQ(testing::error_of([&] { dp->forward(x); }), "replica 0 on cpu failed: negative input\nat row 1");
  auto message = testing::error_of([&] { dp->forward(torch::ones({4, 2})); });
  EXPECT_EQ(message.rfind("replica 0 on cpu failed: ", 0), 0u) << message;
  EXPECT_NE(message.find("cannot be multiplied"), std::string::npos) << message;
  EXPECT_EQ(message.find("Exception raised from"), std::string::npos) << message;
}

// A frozen parameter stays frozen (its replicas too), and two forwards
// before one backward give the gradient of both.
TEST(DataParallelTest, FrozenParametersAndTwoForwardsBeforeBackward) {
  torch::manual_seed(2);
  auto net = mlp();
  auto single = copy_of(net);
  net->named_parameters()["fc1.weight"].set_requires_grad(false);
  single->named_parameters()["fc1.weight"].set_requires_grad(false);
  DataParallel dp(net, DataParallelOptions{cpus(2)});
  auto x1 = torch::randn({4, 6}), x2 = torch::randn({6, 6});
  (dp->forward(x1).sum() + dp->forward(x2).pow(2).sum()).backward();
  (single->forward(x1).sum() + single->forward(x2).pow(2).sum()).backward();
  EXPECT_FALSE(net->named_parameters()["fc1.weight"].grad().defined());
  for (const char* name : {"fc1.bias", "fc2.weight", "fc2.bias"}) {
    EXPECT_TRUE(torch::allclose(net->named_parameters()[name].grad(),
                                single->named_parameters()[name].grad(), 1e-5, 1e-6))
        << name;
  }
}

TEST(DataParallelTest, GradModeFollowsTheCaller) {
  DataParallel dp(mlp(), DataParallelOptions{cpus(2)});
  torch::NoGradGuard no_grad;
  EXPECT_FALSE(dp->forward(torch::randn({4, 6})).requires_grad());
}

// Each replica's thread computes with the process's intra-op thread count
// (at::set_num_threads), in OpenMP and MKL alike, from its first operation
// on: a fresh thread otherwise has their defaults (every core), and its
// first convolution or matrix product would start a team of that size.
TEST(DataParallelTest, ReplicaThreadsComputeWithTheProcesssThreadCount) {
  testing::UnusualThreadCount threads;
  testing::ThreadProbe probe;
  DataParallel dp(probe, DataParallelOptions{cpus(3)});
  dp->forward(torch::randn({6, 6}));
  ASSERT_EQ(probe->seen().size(), 3u);
  for (const auto& seen : probe->seen()) {
    EXPECT_EQ(seen.team.omp, threads.count());
    EXPECT_EQ(seen.team.mkl, threads.count());
  }
}


// Note [kept threads]: every forward runs replica 0 on the caller's thread
// and the others on the same threads as the forward before.
TEST(DataParallelTest, ReplicaThreadsAreKept) {
  testing::ThreadProbe probe;
  DataParallel dp(probe, DataParallelOptions{cpus(3)});
  for (int step = 0; step < 3; ++step) dp->forward(torch::randn({6, 2}));
  std::set<int> threads;
  for (const auto& seen : probe->seen()) threads.insert(seen.thread);
  EXPECT_EQ(probe->seen().size(), 9u);
  EXPECT_EQ(threads.size(), 3u);  // 7 with a new thread per replica and forward
  EXPECT_TRUE(threads.count(testing::thread_serial()));
  // parallel_apply alone starts new threads on every call.
  std::vector<torch::nn::AnyModule> replicas{torch::nn::AnyModule(testing::ThreadProbe(*probe)),
                                             torch::nn::AnyModule(testing::ThreadProbe(*probe))};
  parallel_apply(replicas, {torch::ones({1}), torch::ones({1})}, cpus(2));
  EXPECT_FALSE(threads.count(probe->seen().back().thread));
}

// Note [kept threads]: each replica runs on the caller's current stream of
// its device.
TEST(DataParallelTest, ReplicasRunOnTheCallersStreamOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  testing::ThreadProbe on_gpu;
  DataParallel dp_gpu(on_gpu, DataParallelOptions{{gpu, gpu}});
  c10::impl::VirtualGuardImpl cuda(torch::kCUDA);
  auto side = cuda.getStreamFromGlobalPool(gpu);
  ASSERT_NE(side, cuda.getDefaultStream(gpu));
  {
    c10::StreamGuard on_side(side);
    dp_gpu->forward(torch::ones({4, 2}, gpu));
  }
  ASSERT_EQ(on_gpu->seen().size(), 2u);
  for (const auto& seen : on_gpu->seen()) EXPECT_EQ(seen.stream, side);
}

// A second forward of the same DataParallel while one runs (from another
// thread) would hand the kept threads two tasks: it is refused.
TEST(DataParallelTest, AConcurrentForwardIsRefused) {
  testing::ThreadProbe probe;
  std::promise<void> open;
  probe->shared->gate = open.get_future().share();
  auto entered = probe->shared->entered.get_future();
  DataParallel dp(probe, DataParallelOptions{cpus(2)});
  auto first = std::async(std::launch::async, [&] { return dp->forward(torch::ones({4, 2})); });
  // Without the refusal the second forward would wait at the gate as well: it
  // runs on a thread of its own, and the gate opens before any assertion, so
  // that the test fails instead of hanging.
  const auto bound = std::chrono::seconds(20);
  const bool held = entered.wait_for(bound) == std::future_status::ready;
  std::future<std::string> second;
  if (held) {
    second = std::async(std::launch::async,
                        [&] { return testing::error_of([&] { dp->forward(torch::ones({4, 2})); }); });
  }
  const bool answered = held && second.wait_for(bound) == std::future_status::ready;
  open.set_value();
  ASSERT_TRUE(held) << "the first forward did not reach its replica within 20 s";
  ASSERT_TRUE(answered) << "the second forward was neither refused nor done within 20 s";
  EXPECT_EQ(second.get(),
            "DataParallel over 2 devices: forward called while another forward of the same module "
            "runs; its replicas run one forward at a time");
  EXPECT_TRUE(torch::equal(first.get(), torch::ones({4, 2})));
  probe->shared->gate.reset();
  EXPECT_TRUE(torch::equal(dp->forward(torch::full({4, 2}, 2.0)), torch::full({4, 2}, 2.0)));
}

TEST(DataParallelTest, DeviceListsAreParsedOrNamed) {
  EXPECT_EQ(parse_devices("cpu,cpu").size(), 2u);
  EXPECT_EQ(testing::error_of([] { parse_devices("cpu,tpu"); }),
            "--devices: expected a comma-separated list of cpu, cuda or cuda:N, got 'cpu,tpu'");
  // What the text alone shows is a usage error; what the machine lacks is not.
  EXPECT_THROW(parse_devices("cpu,,cpu"), UsageError);
  EXPECT_THROW(parse_device_names("cuda:0,gpu"), UsageError);
  EXPECT_EQ(parse_device_names("cuda,cuda:5"), (std::vector<torch::Device>{torch::Device("cuda:0"), torch::Device("cuda:5")}));
  if (!torch::cuda::is_available()) {
    try {
      parse_devices("cuda:0,cuda:1");
      ADD_FAILURE() << "parse_devices accepted CUDA devices on a machine without CUDA";
    } catch (const UsageError& e) {
      ADD_FAILURE() << "a missing device is the machine's, not a usage error: " << e.what();
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), "--devices cuda:0,cuda:1: no CUDA device is available on this machine");
    }
  }
}

}  // namespace data_parallel_test
}  // namespace tandem::parallel
