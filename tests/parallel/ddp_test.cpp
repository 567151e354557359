// DistributedDataParallel against one process on the whole batch, with
// several buckets, an unused parameter, and mismatched models. Ranks are
// threads over Gloo on 127.0.0.1.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include <torch/torch.h>

#include "tandem/parallel/ddp.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace ddp_test {  // the file's own names (a layer's tests compile as one unit)

using testing::copy_parameters;
using testing::run_ranks;

// A small MLP with one parameter that forward never uses.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(6, 16));
    fc2 = register_module("fc2", torch::nn::Linear(16, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 3));
    unused = register_parameter("unused", torch::ones({4}));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::relu(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
  torch::Tensor unused;
};
TORCH_MODULE(Net);


constexpr int kSteps = 5;
constexpr int64_t kBatch = 12;

// One process, whole batches: the reference weights.
std::vector<torch::Tensor> reference(const torch::Tensor& inputs, const torch::Tensor& targets) {
  torch::manual_seed(1);
  Net net;
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    auto x = inputs.slice(0, s * kBatch, (s + 1) * kBatch);
    auto y = targets.slice(0, s * kBatch, (s + 1) * kBatch);
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// zero: how gradients are cleared between steps. "ddp": ddp.zero_grad(), in
// place, so the gradients stay bucket storage; "optimizer": the optimizer's
// default, which sets them to undefined.
// device: where every rank's model and data live (Gloo reduces CUDA tensors
// too; there, DDP reduces on its own stream: Note [communication stream]).
void check_ddp_equals_one_process(int world, BucketOptions buckets, const std::string& zero = "optimizer",
                                  std::shared_ptr<CommHook> hook = nullptr, double rtol = 1e-5,
                                  double atol = 1e-6, torch::Device device = torch::kCPU) {
  torch::manual_seed(0);
  auto inputs = torch::randn({kSteps * kBatch, 6});
  auto targets = torch::randint(0, 3, {kSteps * kBatch}, torch::kInt64);
  auto expected = reference(inputs, targets);
  torch::manual_seed(1);
  Net start;  // the reference's start; made here, as the ranks (threads) share torch's RNG
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    Net net;  // a different start on every rank: DDP must broadcast rank 0's...
    if (group->rank() == 0) copy_parameters(*start, *net);  // ...which is the reference's
    net->to(device);
    DdpOptions options;
    options.buckets = buckets;
    options.comm_hook = hook;
    DistributedDataParallel ddp(net.ptr(), group, options);
    if (buckets.bucket_bytes < 1000) EXPECT_GE(ddp.buckets().size(), 3u);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const int64_t per_rank = kBatch / world;
    std::vector<void*> storage;  // where the gradients were after the first step
    for (int s = 0; s < kSteps; ++s) {
      if (zero == "ddp") {
        ddp.zero_grad();
      } else {
        sgd.zero_grad();
      }
      ddp.before_forward();
      auto begin = s * kBatch + group->rank() * per_rank;
      auto x = inputs.slice(0, begin, begin + per_rank).to(device);
      auto y = targets.slice(0, begin, begin + per_rank).to(device);
      torch::nn::functional::cross_entropy(net->forward(x), y).backward();
      ddp.after_backward();
      sgd.step();
      // Note [gradients are bucket views]: the gradients stay where they are.
      std::vector<void*> now;
      for (auto& p : net->parameters()) now.push_back(p.grad().defined() ? p.grad().data_ptr() : nullptr);
      EXPECT_FALSE(net->unused.grad().defined()) << "step " << s;  // unused on every rank
      if (s == 0) storage = now;
      if (zero == "ddp") EXPECT_EQ(now, storage) << "step " << s;
    }
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      auto mine = params[i].cpu();
      EXPECT_TRUE(torch::allclose(mine, expected[i], rtol, atol))
          << "parameter " << i << " on rank " << group->rank() << " (" << device << "), max difference "
          << (mine - expected[i]).abs().max().item<double>();
    }
    EXPECT_TRUE(torch::equal(net->unused.cpu(), torch::ones({4})));  // no gradient, no hang
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DdpTest, TwoRanksEqualOneProcessOnTheWholeBatch) { check_ddp_equals_one_process(2, {}); }

// Both ranks on cuda:0 (Gloo; NCCL refuses two ranks on one GPU), through
// the communication stream, in place and not.
TEST(DdpTest, TwoRanksOnOneGpuEqualOneProcess) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  check_ddp_equals_one_process(2, {64, 256}, "optimizer", nullptr, 1e-4, 1e-5, cuda);
  check_ddp_equals_one_process(2, {64, 256}, "ddp", nullptr, 1e-4, 1e-5, cuda);
}
TEST(DdpTest, ThreeRanksWithManySmallBuckets) { check_ddp_equals_one_process(3, {64, 256}); }

// Note [small last bucket]: fc1's weight and bias (448 bytes) reduce in a
// bucket of their own, launched last.
TEST(DdpTest, ASmallLastBucketReducesLikeTheOthers) {
  check_ddp_equals_one_process(2, {64, 256, 400});
  check_ddp_equals_one_process(3, {1 << 20, 25 << 20, 400}, "ddp");
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    Net net;
    DdpOptions options;
    options.buckets = {1 << 20, 25 << 20, 400};
    DistributedDataParallel ddp(net.ptr(), group, options);
    ASSERT_EQ(ddp.buckets().size(), 2u);
    EXPECT_EQ(ddp.buckets().back().parameters, (std::vector<size_t>{1, 0}));
  });
  testing::expect_no_errors(errors);
}
TEST(DdpTest, FourRanksOneBucketEach) { check_ddp_equals_one_process(4, {1, 1}); }
TEST(DdpTest, ZeroGradInPlaceKeepsGradientsInTheBuckets) {
  check_ddp_equals_one_process(2, {64, 256}, "ddp");
  check_ddp_equals_one_process(3, {}, "ddp");
}
// Compressed hooks round each contribution: close to, not equal to, the
// reference after five steps.
TEST(DdpTest, Fp16AndBf16HooksTrainCloseToTheReference) {
  check_ddp_equals_one_process(2, {64, 256}, "ddp", make_comm_hook("fp16"), 2e-3, 2e-4);
  check_ddp_equals_one_process(2, {64, 256}, "ddp", make_comm_hook("bf16"), 2e-2, 2e-3);
}

// On a GPU the hook's casts run on the communication stream.
TEST(DdpTest, Fp16HookOnOneGpuTrainsCloseToTheReference) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device cuda(torch::kCUDA, 0);
  check_ddp_equals_one_process(2, {64, 256}, "ddp", make_comm_hook("fp16"), 2e-3, 2e-4, cuda);
}

// The gradients of one step land on every rank as the hook's arithmetic
// says: each rank's gradient divided by the world size and rounded to the
// compressed type, summed in it, cast back.
TEST(DdpTest, CompressionHooksReduceInTheirDtype) {
  for (auto [hook, dtype] : {std::pair{"fp16", torch::kHalf}, std::pair{"bf16", torch::kBFloat16}}) {
    const std::string name = hook;  // a variable the rank lambdas can capture (C++17)
    SCOPED_TRACE(name);
    const int world = 2;
    auto inputs = torch::randn({world, 4, 6});
    torch::manual_seed(3);
    torch::nn::Linear start(6, 3);
    std::vector<torch::Tensor> local(world);  // each rank's own weight gradient
    for (int r = 0; r < world; ++r) {
      torch::nn::Linear copy(6, 3);
      torch::NoGradGuard no_grad;
      copy->weight.copy_(start->weight);
      copy->bias.copy_(start->bias);
      torch::GradMode::set_enabled(true);
      copy->forward(inputs[r]).pow(2).sum().backward();
      local[r] = copy->weight.grad().clone();
    }
    auto want = ((local[0] / world).to(dtype) + (local[1] / world).to(dtype)).to(torch::kFloat);
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      torch::nn::Linear net(6, 3);
      {
        torch::NoGradGuard no_grad;
        net->weight.copy_(start->weight);
        net->bias.copy_(start->bias);
      }
      DdpOptions options;
      options.comm_hook = make_comm_hook(name);
      DistributedDataParallel ddp(net.ptr(), group, options);
      EXPECT_EQ(ddp.comm_hook().name(), name);
      ddp.before_forward();
      net->forward(inputs[group->rank()]).pow(2).sum().backward();
      ddp.after_backward();
      EXPECT_TRUE(torch::equal(net->weight.grad(), want))
          << "rank " << group->rank() << ": max difference "
          << (net->weight.grad() - want).abs().max().item<double>();
    });
    testing::expect_no_errors(errors);
  }
}

TEST(DdpTest, UnknownCommHookIsNamed) {
  EXPECT_EQ(testing::error_of([] { make_comm_hook("int8"); }),
            "--ddp-comm-hook: expected allreduce, fp16 or bf16, got 'int8'");
}

// Note [unused parameters]: with find_unused_parameters the graph walk marks
// `unused` ready before backward, so every bucket starts during backward
// (without it, the bucket holding `unused` waits for after_backward); either
// way a parameter unused on every rank keeps an undefined gradient (as in
// one process), and one used on only one rank gets that rank's gradient
// averaged over both.
TEST(DdpTest, FindUnusedParametersLaunchesEarlyAndLeavesGloballyUnusedAlone) {
  for (bool find_unused : {false, true}) {
    SCOPED_TRACE(find_unused ? "find_unused_parameters" : "default");
    auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
      Net net;
      auto extra = net->register_parameter("extra", torch::ones({3}));  // used by rank 0 only
      DdpOptions options;
      options.buckets = {64, 256};
      options.find_unused_parameters = find_unused;
      DistributedDataParallel ddp(net.ptr(), group, options);
      ddp.before_forward();
      auto loss = net->forward(torch::ones({2, 6})).sum();
      if (group->rank() == 0) loss = loss + extra.sum() * 4;
      ddp.prepare_for_backward(loss);
      loss.backward();
      ddp.after_backward();
      const auto& t = ddp.last_timeline();
      int early = 0;
      for (const auto& launched : t.launched) early += launched < t.backward_end;
      int buckets = static_cast<int>(ddp.buckets().size());
      if (find_unused) {
        EXPECT_EQ(early, buckets);
      } else {
        EXPECT_LT(early, buckets);  // `unused`'s bucket waited for after_backward
      }
      EXPECT_FALSE(net->unused.grad().defined());  // unused on every rank: none, either way
      EXPECT_TRUE(torch::equal(extra.grad(), torch::full({3}, 2.0f)));  // (4 + 0) / 2
    });
    testing::expect_no_errors(errors);
  }
}

// Passes no gradient back: its input is reachable, but gets none.
struct NoGradientThrough : torch::autograd::Function<NoGradientThrough> {
  static torch::Tensor forward(torch::autograd::AutogradContext*, const torch::Tensor& x) {
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list) {
    return {torch::Tensor()};
  }
};

// A parameter the graph reaches but that receives an undefined gradient,
// with gradients set to none between steps: no error, and no gradient (not
// last step's average, nor a zero one that weight decay would act on).
TEST(DdpTest, AReachableParameterWithoutAGradientCountsAsUnused) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    Net net;
    auto extra = net->register_parameter("extra", torch::ones({3}));
    DistributedDataParallel ddp(net.ptr(), group);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    for (int step = 0; step < 2; ++step) {
      sgd.zero_grad();
      ddp.before_forward();
      auto loss = net->forward(torch::ones({2, 6})).sum() + NoGradientThrough::apply(extra).sum();
      if (step == 0) loss = loss + extra.sum();  // a real gradient in the first step only
      loss.backward();
      ddp.after_backward();
      if (step == 0) {
        EXPECT_TRUE(torch::equal(extra.grad(), torch::full({3}, 1.0f))) << "rank " << group->rank();
      } else {
        EXPECT_FALSE(extra.grad().defined()) << "rank " << group->rank();
      }
    }
  });
  testing::expect_no_errors(errors);
}

// A second backward pass in one step, after the buckets went out: a clear
// error rather than a silently wrong gradient.
TEST(DdpTest, SecondBackwardInOneStepIsAnError) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    torch::nn::Linear net(4, 2);
    DistributedDataParallel ddp(net.ptr(), group);
    ddp.before_forward();
    auto x = torch::randn({3, 4});
    net->forward(x).sum().backward();
    net->forward(x).sum().backward();
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("parameter 'bias' received a gradient after its bucket's all-reduce had "
                     "started (a second backward pass in one step? use no_sync() for all but the "
                     "last)"),
              std::string::npos)
        << e;
  }
}

// A loop that forgets after_backward() (Note [a step ends in
// after_backward]) fails at its next step, naming the call, instead of
// stepping on gradients still being reduced.
TEST(DdpTest, AStepWithoutAfterBackwardIsRefusedAtTheNext) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    torch::nn::Linear net(4, 2);
    DistributedDataParallel ddp(net.ptr(), group);
    torch::optim::SGD sgd(net->parameters(), 0.1);
    auto x = torch::randn({3, 4});
    for (int step = 0; step < 2; ++step) {  // the first step is whole
      ddp.zero_grad();
      ddp.before_forward();
      net->forward(x).sum().backward();
      ddp.after_backward();
      sgd.step();
    }
    ddp.zero_grad();
    ddp.before_forward();
    net->forward(x).sum().backward();
    sgd.step();  // no after_backward()
    ddp.zero_grad();
    ddp.before_forward();
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("DistributedDataParallel: before_forward() while the last step's gradients were still being "
                     "reduced: call after_backward() after each backward"),
              std::string::npos)
        << e;
  }
}

TEST(DdpTest, HiddenShareIsTheCommunicationBeforeBackwardEnded) {
  using namespace std::chrono_literals;
  DdpTimeline t;
  auto t0 = std::chrono::steady_clock::time_point{};
  EXPECT_EQ(hidden_share(t), 1.0);  // nothing to hide
  t.backward_end = t0 + 10ms;
  // [2, 6] and [4, 8] overlap into [2, 8]; [12, 14] is after backward.
  t.launched = {t0 + 2ms, t0 + 4ms, t0 + 12ms};
  t.finished = {t0 + 6ms, t0 + 8ms, t0 + 14ms};
  EXPECT_DOUBLE_EQ(hidden_share(t), 6.0 / 8.0);
  // [9, 13]: 1 ms of 4 before the end.
  t.launched = {t0 + 9ms};
  t.finished = {t0 + 13ms};
  EXPECT_DOUBLE_EQ(hidden_share(t), 0.25);
}

// Note [bucket launch order]: with every parameter used, the hooks start
// buckets during backward, before after_backward(); each rank launches all
// of them.
TEST(DdpTest, BucketsStartDuringBackward) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    torch::nn::Sequential net(torch::nn::Linear(8, 32), torch::nn::ReLU(), torch::nn::Linear(32, 32),
                              torch::nn::ReLU(), torch::nn::Linear(32, 4));
    DistributedDataParallel ddp(net.ptr(), group, DdpOptions{{256, 1024}});
    ASSERT_GE(ddp.buckets().size(), 3u);
    ddp.before_forward();
    net->forward(torch::randn({5, 8})).sum().backward();
    ddp.after_backward();
    const auto& t = ddp.last_timeline();
    int early = 0;
    for (const auto& launched : t.launched) early += launched < t.backward_end;
    EXPECT_EQ(early, static_cast<int>(ddp.buckets().size()));
  });
  for (int r = 0; r < 2; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// no_sync over k micro-batches, then one synchronised one, gives the
// gradient of one batch k + 1 times larger (losses scaled by 1 / (k + 1)).
TEST(DdpTest, NoSyncAccumulatesLikeOneLargerBatch) {
  const int world = 2, micro = 3;
  const int64_t per_micro = 2;
  torch::manual_seed(4);
  auto inputs = torch::randn({world * micro * per_micro, 6});
  auto targets = torch::randint(0, 3, {world * micro * per_micro}, torch::kInt64);
  torch::manual_seed(1);
  Net reference;
  torch::nn::functional::cross_entropy(reference->forward(inputs), targets).backward();
  torch::manual_seed(1);
  Net start;
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    Net net;
    copy_parameters(*start, *net);
    DistributedDataParallel ddp(net.ptr(), group);
    auto step = [&](int m) {
      ddp.before_forward();
      auto begin = (group->rank() * micro + m) * per_micro;
      auto x = inputs.slice(0, begin, begin + per_micro);
      auto y = targets.slice(0, begin, begin + per_micro);
      (torch::nn::functional::cross_entropy(net->forward(x), y) / micro).backward();
      ddp.after_backward();
    };
    {
      auto scope = ddp.no_sync();
      for (int m = 0; m + 1 < micro; ++m) step(m);
      // Nothing was reduced yet: the ranks' gradients still differ.
      std::vector<torch::Tensor> both{torch::empty_like(net->fc1->weight),
                                      torch::empty_like(net->fc1->weight)};
      group->all_gather(both, net->fc1->weight.grad()).wait();
      EXPECT_FALSE(torch::allclose(both[0], both[1]));
    }
    step(micro - 1);
    auto got = net->parameters();
    auto want = reference->parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      if (!want[i].grad().defined()) continue;  // `unused`
      EXPECT_TRUE(torch::allclose(got[i].grad(), want[i].grad(), 1e-5, 1e-6))
          << "parameter " << i << " on rank " << group->rank();
    }
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DdpTest, DifferentModelsAreAClearError) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = std::make_shared<torch::nn::LinearImpl>(group->rank() == 0 ? 4 : 5, 2);
    DistributedDataParallel ddp(net, group);
  });
  for (const auto& e : errors) {
    EXPECT_NE(e.find("rank 1 has different parameters (names or shapes) from rank 0"),
              std::string::npos)
        << e;
  }
}


// Note [traffic]: each DDP step all-reduces every gradient byte once (the
// buckets cover each parameter once), whatever the bucket sizes, plus one
// int32 flag a parameter (which ranks' backward reached it: the unused
// parameters' map), and nothing else; a ring all-reduce then puts
// 2 (n - 1) / n of that on the wire. The construction's broadcast of rank
// 0's weights is counted apart.
TEST(DdpTest, EachStepAllReducesEveryGradientByteOnce) {
  for (const BucketOptions buckets : {BucketOptions{}, BucketOptions{64, 256}}) {
    testing::expect_no_errors(run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
      Net net;
      int64_t bytes = 0;
      for (const auto& p : net->parameters()) bytes += p.numel() * static_cast<int64_t>(p.element_size());
      DdpOptions options;
      options.buckets = buckets;
      DistributedDataParallel ddp(net.ptr(), group, options);
      EXPECT_EQ(group->traffic()["broadcast"].bytes, bytes) << "rank 0's weights, once";
      group->reset_traffic();
      for (int step = 0; step < 3; ++step) {
        ddp.before_forward();
        torch::nn::functional::cross_entropy(net->forward(torch::randn({4, 6})), torch::randint(0, 3, {4}))
            .backward();
        ddp.after_backward();
        const auto traffic = group->traffic();
        const auto flags = 4 * static_cast<int64_t>(net->parameters().size());
        EXPECT_EQ(traffic.at("all_reduce").bytes, (step + 1) * (bytes + flags)) << "step " << step;
        EXPECT_EQ(traffic.at("all_reduce").calls, (step + 1) * static_cast<int64_t>(ddp.buckets().size() + 1));
        EXPECT_EQ(traffic.size(), 1u) << "only all-reduces in a step";
      }
    }));
  }
}

}  // namespace ddp_test
}  // namespace tandem::parallel
