// DistributedDataParallel against one process on the whole batch, with
// several buckets, an unused parameter, and mismatched models. Ranks are
// threads over Gloo on 127.0.0.1.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include <torch/torch.h>

#include "tandem/parallel/ddp.h"
#include "tandem/util/check.h"

namespace tandem::parallel {
namespace {

std::vector<std::string> run_ranks(int world, const std::function<void(std::shared_ptr<dist::ProcessGroup>)>& fn) {
  int port = dist::pick_free_port();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        dist::Rendezvous rv;
        rv.port = port;
        rv.rank = r;
        rv.world_size = world;
        rv.local_rank = r;
        rv.local_world_size = world;
        fn(std::make_shared<dist::ProcessGroup>(rv));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

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

void check_ddp_equals_one_process(int world, BucketOptions buckets) {
  torch::manual_seed(0);
  auto inputs = torch::randn({kSteps * kBatch, 6});
  auto targets = torch::randint(0, 3, {kSteps * kBatch}, torch::kInt64);
  auto expected = reference(inputs, targets);
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    torch::manual_seed(100 + group->rank());  // different starts: DDP must broadcast rank 0's...
    Net net;
    if (group->rank() == 0) {  // ...which is the reference's start
      torch::manual_seed(1);
      Net start;
      torch::NoGradGuard no_grad;
      auto src = start->parameters();
      auto dst = net->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
    DistributedDataParallel ddp(net.ptr(), group, DdpOptions{buckets});
    if (buckets.bucket_bytes < 1000) EXPECT_GE(ddp.buckets().size(), 3u);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    const int64_t per_rank = kBatch / world;
    for (int s = 0; s < kSteps; ++s) {
      sgd.zero_grad();
      ddp.before_forward();
      auto begin = s * kBatch + group->rank() * per_rank;
      auto x = inputs.slice(0, begin, begin + per_rank);
      auto y = targets.slice(0, begin, begin + per_rank);
      torch::nn::functional::cross_entropy(net->forward(x), y).backward();
      ddp.after_backward();
      sgd.step();
    }
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i], expected[i], 1e-5, 1e-6))
          << "parameter " << i << " on rank " << group->rank() << ", max difference "
          << (params[i] - expected[i]).abs().max().item<double>();
    }
    EXPECT_TRUE(torch::equal(net->unused, torch::ones({4})));  // zero gradient, no hang
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(DdpTest, TwoRanksEqualOneProcessOnTheWholeBatch) { check_ddp_equals_one_process(2, {}); }
TEST(DdpTest, ThreeRanksWithManySmallBuckets) { check_ddp_equals_one_process(3, {64, 256}); }
TEST(DdpTest, FourRanksOneBucketEach) { check_ddp_equals_one_process(4, {1, 1}); }

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
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    Net net;
    {
      torch::manual_seed(1);
      Net start;
      torch::NoGradGuard no_grad;
      auto src = start->parameters();
      auto dst = net->parameters();
      for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
    }
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

}  // namespace
}  // namespace tandem::parallel
