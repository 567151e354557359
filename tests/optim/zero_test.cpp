// ZeroSgd (Note [sharded optimizer state]) against the plain Sgd: the same
// weights bit for bit on every rank, a rank holding only its share of the
// momentum, and checkpoints in Sgd's form that load either way, on any
// number of ranks. Ranks are threads in a Gloo group on 127.0.0.1.
#include <gtest/gtest.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>

#include "tandem/optim/make_optimizer.h"
#include "tandem/optim/schedule.h"
#include "tandem/optim/zero.h"
#include "testing.h"

namespace tandem::optim {
namespace zero_test {  // the file's own names (a layer's tests compile as one unit)

using testing::error_of;

TEST(PlanShardsTest, LargestFirstToTheLightestRank) {
  // 10 -> r0; 7 -> r1; 3 (third) -> r1 (7 < 10); 3 (fourth) -> r0 (10 = 10: the lower rank); 1 -> r1.
  EXPECT_EQ(plan_shards({10, 1, 7, 3, 3}, 2), (std::vector<int64_t>{0, 1, 1, 1, 0}));
  EXPECT_EQ(plan_shards({10, 1, 7, 3, 3}, 1), (std::vector<int64_t>{0, 0, 0, 0, 0}));
  // More ranks than tensors: one each, largest first; ranks 5 and 6 own nothing.
  EXPECT_EQ(plan_shards({10, 1, 7, 3, 3}, 7), (std::vector<int64_t>{0, 4, 1, 2, 3}));
  EXPECT_TRUE(plan_shards({}, 3).empty());
  EXPECT_NE(error_of([] { plan_shards({1}, 0); }).find("world size of at least 1, got 0"), std::string::npos);
  EXPECT_NE(error_of([] { plan_shards({1, -2}, 2); }).find("a parameter of -2 elements"), std::string::npos);
  // A second parameter group starts from the first's loads.
  std::vector<int64_t> loads{0, 0};
  EXPECT_EQ(plan_shards({10, 3}, 2, &loads), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(plan_shards({4, 4}, 2, &loads), (std::vector<int64_t>{1, 1}));  // rank 1: 3, then 7 (< 10), then 11
  EXPECT_EQ(loads, (std::vector<int64_t>{10, 11}));
  std::vector<int64_t> three{0, 0, 0};
  EXPECT_NE(error_of([&] { plan_shards({1}, 2, &three); }).find("3 loads for a world of 2"), std::string::npos);
}

TEST(PlanShardsTest, SharesDifferByAtMostTheLargestTensor) {
  // Greedy largest-first: when the heaviest rank took its last tensor it was
  // the lightest, so no two loads differ by more than one tensor.
  std::mt19937 random(3);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> numels(1 + random() % 40);
    for (auto& n : numels) n = random() % 5000;
    const int64_t world = 1 + random() % 8;
    auto owners = plan_shards(numels, world);
    std::vector<int64_t> load(world, 0);
    for (size_t i = 0; i < numels.size(); ++i) {
      ASSERT_TRUE(owners[i] >= 0 && owners[i] < world);
      load[owners[i]] += numels[i];
    }
    auto [lo, hi] = std::minmax_element(load.begin(), load.end());
    EXPECT_LE(*hi - *lo, *std::max_element(numels.begin(), numels.end())) << "trial " << trial;
    EXPECT_EQ(plan_shards(numels, world), owners);  // deterministic
  }
}

// Eight parameters of two dtypes and several sizes, one in channels-last
// order and one not dense (every other column of a matrix: ZeroSgd
// broadcasts it apart from the flat buffers); the fourth gets no gradient
// on odd steps (the same on every rank, as after DDP). Drawn from
// a generator of their own: the ranks are threads, and reseeding the
// process's default generator from several at once would hand them
// different parameters.
std::vector<torch::Tensor> make_parameters() {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(11);
  auto draw = [&](std::vector<int64_t> sizes, torch::Dtype dtype = torch::kFloat32) {
    return torch::randn(sizes, generator, torch::dtype(dtype)).requires_grad_();
  };
  auto nhwc = torch::randn({4, 3, 2, 2}, generator).contiguous(torch::MemoryFormat::ChannelsLast);
  auto strided = torch::randn({5, 8}, generator).slice(/*dim=*/1, 0, 8, /*step=*/2);
  return {draw({16, 8}), draw({8}), draw({6, 5}, torch::kFloat64), draw({3, 3}), draw({40}),
          draw({2}, torch::kFloat64), nhwc.requires_grad_(), strided.requires_grad_()};
}

std::vector<torch::Tensor> copies(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> out;
  for (const auto& p : params) out.push_back(p.detach().clone().requires_grad_());
  return out;
}

void fake_backward(std::vector<torch::Tensor>& params, int step) {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (i == 3 && step % 2 == 1) {
      params[i].mutable_grad() = torch::Tensor();
      continue;
    }
    params[i].mutable_grad() = torch::cos(params[i] * (step + 2) + static_cast<double>(i)).detach();
  }
}

const auto kOptions = torch::optim::SGDOptions(0.1).momentum(0.9).nesterov(true).weight_decay(1e-2);

// Steps `optimizer` over `params` from step `from` to `to` (exclusive), with
// a scheduled learning rate.
template <typename Optimizer>
void train(Optimizer& optimizer, std::vector<torch::Tensor>& params, int from, int to) {
  for (int step = from; step < to; ++step) {
    set_lr(optimizer, 0.1 / (step + 1));
    fake_backward(params, step);
    optimizer.step();
  }
}

torch::Tensor momentum_of(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  auto& state = optimizer.state();
  auto found = state.find(p.unsafeGetTensorImpl());
  if (found == state.end()) return {};
  return static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
}

std::string save_to_string(torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void load_from_string(torch::optim::Optimizer& optimizer, const std::string& bytes) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  optimizer.load(archive);
}

dist::GroupOptions short_timeout() {
  dist::GroupOptions options;
  options.timeout = std::chrono::seconds(60);  // a rank that fell out of step fails the test, not CI
  return options;
}

TEST(ZeroSgdTest, EveryRankEndsWithSgdsWeightsBitForBit) {
  auto reference = make_parameters();
  Sgd plain(reference, kOptions);
  train(plain, reference, 0, 6);
  for (int world : {1, 2, 3, 7}) {  // 7: more ranks than tensors, some owning nothing
    std::mutex lock;
    int64_t buffers_held = 0;
    std::vector<int64_t> owned_elements;
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto params = make_parameters();
      ZeroSgd zero(params, kOptions, group);
      train(zero, params, 0, 6);
      int64_t mine = 0;
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(params[i], reference[i])) << "world " << world << ", rank "
                                                           << zero.rank() << ", parameter " << i;
        auto buffer = momentum_of(zero, params[i]);
        EXPECT_EQ(buffer.defined(), zero.owner(params[i]) == zero.rank()) << "parameter " << i;
        if (buffer.defined()) {
          EXPECT_TRUE(torch::equal(buffer, momentum_of(plain, reference[i]))) << "parameter " << i;
          mine += buffer.numel();
        }
      }
      // With several ranks the dense parameters are views of the owners'
      // flat buffers, in their own strides; the strided one is not.
      EXPECT_TRUE(params[6].is_contiguous(torch::MemoryFormat::ChannelsLast));
      EXPECT_EQ(params[7].strides(), (std::vector<int64_t>{8, 2}));
      for (size_t i = 0; i < params.size(); ++i) {
        int in_buffers = 0;
        for (const auto& buffer : zero.flat_buffers()) {
          in_buffers += params[i].storage().unsafeGetStorageImpl() == buffer.storage().unsafeGetStorageImpl();
        }
        EXPECT_EQ(in_buffers, world > 1 && i != 7 ? 1 : 0) << "world " << world << ", parameter " << i;
      }
      std::lock_guard<std::mutex> guard(lock);
      buffers_held += static_cast<int64_t>(zero.state().size());
      if (zero.rank() == 0) owned_elements = zero.shard_numels();
      EXPECT_EQ(mine, zero.shard_numels()[zero.rank()]);
    }, short_timeout(), 0, /*null_group_for_one=*/true));
    EXPECT_EQ(buffers_held, 8) << "world " << world << ": each buffer on exactly one rank";
    EXPECT_EQ(std::accumulate(owned_elements.begin(), owned_elements.end(), int64_t{0}),
              16 * 8 + 8 + 30 + 9 + 40 + 2 + 48 + 20);
  }
}

TEST(ZeroSgdTest, WithoutTheBroadcastsTheRanksWouldDrift) {
  // The control for the test above: a rank that steps only its share and
  // receives nothing leaves the others' parameters where they were.
  auto reference = make_parameters();
  Sgd plain(reference, kOptions);
  train(plain, reference, 0, 2);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto alone = make_parameters();
    ZeroSgd sharded(alone, kOptions, group);
    // Step only the share, as ZeroSgd's own Sgd::step does, without broadcasting.
    for (int step = 0; step < 2; ++step) {
      set_lr(sharded, 0.1 / (step + 1));
      fake_backward(alone, step);
      sharded.Sgd::step();
    }
    for (size_t i = 0; i < alone.size(); ++i) {
      bool mine = sharded.owner(alone[i]) == sharded.rank();
      EXPECT_EQ(torch::equal(alone[i], reference[i]), mine) << "parameter " << i;
    }
  }, short_timeout()));
}

// `own` parameters (the experts a rank holds under expert parallelism)
// differ over the group: each rank steps its own and keeps its momentum,
// through consolidate_state() and shard_state(), and nothing of them is
// sent. Control: planned as a share, rank 1's ends as its owner's.
TEST(ZeroSgdTest, OwnParametersAreSteppedByEachRankAndNeverSent) {
  for (const bool own : {true, false}) {
    testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto reference = make_parameters();
      auto params = make_parameters();
      {
        torch::NoGradGuard no_grad;
        reference[0].add_(group->rank());  // each rank's own values
        params[0].add_(group->rank());
      }
      Sgd plain(reference, kOptions);
      train(plain, reference, 0, 4);
      ZeroSgd zero(params, kOptions, group, {}, own ? std::vector<torch::Tensor>{params[0]} : std::vector<torch::Tensor>{});
      train(zero, params, 0, 2);
      zero.consolidate_state();
      zero.shard_state();
      train(zero, params, 2, 4);
      const bool mine = !own && zero.owner(params[0]) == zero.rank();
      EXPECT_EQ(torch::equal(params[0], reference[0]), own || mine) << "own " << own << ", rank " << zero.rank();
      for (size_t i = 1; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
      if (own) {
        EXPECT_EQ(zero.owner(params[0]), ZeroSgd::kOwnEverywhere);
        EXPECT_TRUE(torch::equal(momentum_of(zero, params[0]), momentum_of(plain, reference[0])));
      }
    }, short_timeout()));
  }
}

TEST(ZeroSgdTest, CheckpointsHoldTheWholeStateAndLoadEitherWay) {
  // Uninterrupted: 8 plain steps. Interrupted at 4 in each of three ways.
  auto reference = make_parameters();
  Sgd plain(reference, kOptions);
  train(plain, reference, 0, 4);
  const auto halfway = copies(reference);
  std::vector<torch::Tensor> halfway_momentum;
  for (const auto& p : reference) halfway_momentum.push_back(momentum_of(plain, p).clone());
  const std::string plain_state = save_to_string(plain);
  train(plain, reference, 4, 8);

  // 1. Sharded on 2 ranks, consolidated and saved, resumed by a plain Sgd.
  std::string sharded_state;
  std::vector<std::string> refusal(2);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto params = make_parameters();
    ZeroSgd zero(params, kOptions, group);
    train(zero, params, 0, 4);
    refusal[zero.rank()] = error_of([&] { save_to_string(zero); });
    zero.consolidate_state();
    EXPECT_TRUE(zero.consolidated());
    EXPECT_EQ(zero.state().size(), 8u) << "rank " << zero.rank() << " after consolidate_state()";
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(momentum_of(zero, params[i]), halfway_momentum[i]))
          << "rank " << zero.rank() << ", parameter " << i << " after consolidate_state()";
    }
    auto bytes = save_to_string(zero);
    if (zero.rank() == 0) sharded_state = bytes;
    // The next step drops the others' buffers again and still matches.
    train(zero, params, 4, 8);
    EXPECT_FALSE(zero.consolidated());
    EXPECT_LT(zero.state().size(), 8u);
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
  }, short_timeout()));
  for (const auto& message : refusal) {
    EXPECT_NE(message.find("call consolidate_state() on every rank first"), std::string::npos) << message;
  }
  {
    auto params = copies(halfway);
    Sgd resumed(params, kOptions);
    load_from_string(resumed, sharded_state);
    train(resumed, params, 4, 8);
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::equal(params[i], reference[i])) << "plain Sgd from a sharded checkpoint, parameter " << i;
    }
  }

  // 2. A plain Sgd's checkpoint, and 3. the sharded one, resumed sharded on 3 ranks.
  for (const std::string* state : {&plain_state, static_cast<const std::string*>(&sharded_state)}) {
    testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto params = copies(halfway);
      ZeroSgd zero(params, kOptions, group);
      load_from_string(zero, *state);
      for (const auto& p : params) {
        if (zero.owner(p) != zero.rank()) EXPECT_FALSE(momentum_of(zero, p).defined());
      }
      train(zero, params, 4, 8);
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(params[i], reference[i])) << "rank " << zero.rank() << ", parameter " << i;
      }
    }, short_timeout()));
  }
}

TEST(ZeroSgdTest, ParameterGroupsArePlannedOneAfterAnother) {
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto params = make_parameters();  // the first six: sizes 128, 8, 30, 9, 40, 2
    std::vector<torch::optim::OptimizerParamGroup> groups{
        torch::optim::OptimizerParamGroup({params[0], params[1], params[2]}),
        torch::optim::OptimizerParamGroup({params[3], params[4], params[5]})};
    ZeroSgd zero(groups, kOptions, group);
    // First group: 128 -> r0, 30 -> r1, 8 -> r1. Second, from loads (128, 38): 40, 9, 2 -> r1.
    std::vector<int64_t> owners;
    for (size_t i = 0; i < 6; ++i) owners.push_back(zero.owner(params[i]));
    EXPECT_EQ(owners, (std::vector<int64_t>{0, 1, 1, 1, 1, 1}));
    EXPECT_EQ(zero.shard_numels(), (std::vector<int64_t>{128, 89}));
  }, short_timeout()));
}

// AdamW sharded the same way (ZeroAdamW): every rank ends with plain
// AdamW's weights bit for bit over two groups (decayed and not), each
// parameter's step and moments on its owner only; consolidated, the state
// saved is plain AdamW's and resumes sharded on 3 ranks or plain.
TEST(ZeroAdamWTest, EveryRankEndsWithAdamWsWeightsAndItsCheckpointsLoadEitherWay) {
  const auto options = torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).weight_decay(0.1);
  auto groups = [&](const std::vector<torch::Tensor>& params) {
    torch::OrderedDict<std::string, torch::Tensor> named;
    for (size_t i = 0; i < params.size(); ++i) named.insert("p" + std::to_string(i), params[i]);
    return decay_groups(named, options);
  };
  auto reference = make_parameters();
  AdamW plain(groups(reference), options);
  train(plain, reference, 0, 4);
  const auto halfway = copies(reference);
  train(plain, reference, 4, 8);
  std::string sharded_state;
  for (int world : {2, 3}) {
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto params = make_parameters();
      ZeroAdamW zero(groups(params), options, group);
      train(zero, params, 0, 4);
      for (const auto& p : params) {
        EXPECT_EQ(zero.state().count(p.unsafeGetTensorImpl()) == 1, zero.owner(p) == zero.rank());
      }
      EXPECT_LT(zero.state().size(), 8u) << "rank " << zero.rank() << " holds every parameter's state";
      zero.consolidate_state();
      EXPECT_EQ(zero.state().size(), 8u) << "rank " << zero.rank() << " after consolidate_state()";
      auto bytes = save_to_string(zero);
      if (zero.rank() == 0 && world == 2) sharded_state = bytes;
      train(zero, params, 4, 8);
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_TRUE(torch::equal(params[i], reference[i])) << "world " << world << ", rank " << zero.rank()
                                                           << ", parameter " << i;
      }
    }, short_timeout()));
  }
  // The consolidated state resumes plain, and sharded on 3 ranks.
  {
    auto params = copies(halfway);
    AdamW resumed(groups(params), options);
    load_from_string(resumed, sharded_state);
    train(resumed, params, 4, 8);
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
  }
  testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto params = copies(halfway);
    ZeroAdamW zero(groups(params), options, group);
    load_from_string(zero, sharded_state);
    train(zero, params, 4, 8);
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i])) << i;
  }, short_timeout()));
}

TEST(ZeroSgdTest, AParameterOutsideThePlanIsNamed) {
  auto params = make_parameters();
  ZeroSgd zero(params, kOptions, nullptr);
  auto late = torch::zeros({4, 7}).requires_grad_();
  zero.add_param_group(torch::optim::OptimizerParamGroup({late}));
  late.mutable_grad() = torch::ones({4, 7});
  auto message = error_of([&] { zero.step(); });
  EXPECT_NE(message.find("a parameter of shape [4, 7] is not among those it was constructed with"),
            std::string::npos) << message;
  EXPECT_NE(error_of([&] { ZeroSgd twice({params[0], params[0]}, kOptions, nullptr); })
                .find("parameter 1 appears twice"),
            std::string::npos);
}

// optim::make_optimizer, the one place a run's optimizer is built: AdamW in
// nanoGPT's decay groups (matrices decayed, vectors not) or SGD, plain
// without a group and ZeRO-1 over one, which steps as the plain one does.
TEST(MakeOptimizerTest, PlainOrShardedAsAsked) {
  torch::nn::Linear layer(4, 3);
  const auto adamw = OptimizerSettings::of(torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
  auto plain = make_optimizer(adamw, layer->named_parameters());
  ASSERT_NE(dynamic_cast<AdamW*>(plain.optimizer.get()), nullptr);
  EXPECT_EQ(plain.sharded, nullptr);
  ASSERT_EQ(plain.optimizer->param_groups().size(), 2u);
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(plain.optimizer->param_groups()[0].options()).weight_decay(), 0.1);
  EXPECT_EQ(static_cast<torch::optim::AdamWOptions&>(plain.optimizer->param_groups()[1].options()).weight_decay(), 0.0);
  const auto sgd = OptimizerSettings::of(torch::optim::SGDOptions(0.1).momentum(0.9));
  EXPECT_NE(dynamic_cast<Sgd*>(make_optimizer(sgd, layer->named_parameters()).optimizer.get()), nullptr);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    torch::manual_seed(1);
    torch::nn::Linear mine(4, 3);
    auto built = make_optimizer(sgd, mine->named_parameters(), group);
    if (built.sharded == nullptr || dynamic_cast<ZeroSgd*>(built.optimizer.get()) == nullptr) {
      throw std::runtime_error("not ZeRO-1's SGD");
    }
    EXPECT_EQ(built.sharded->world_size(), 2);
  }));
}

}  // namespace zero_test
}  // namespace tandem::optim
