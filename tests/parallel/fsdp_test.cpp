// Fully sharded data parallelism: the unit and shard plans, then FSDP on
// rank threads over Gloo against one process on the whole batch (and
// against DDP where BatchNorm makes the batch's split matter).
#include "fsdp_fixture.h"

namespace tandem::parallel {
namespace {

TEST(FsdpPlanTest, UnitsCloseAtTheMinimumAndTheRestJoinsTheLast) {
  auto ranges = [](const std::vector<FsdpUnitPlan>& units) {
    std::vector<std::pair<size_t, size_t>> out;
    for (const auto& u : units) out.emplace_back(u.begin, u.end);
    return out;
  };
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  // conv 40, relu 0, pool 0, fc 1040, relu 0, fc 85
  const std::vector<int64_t> layers{40, 0, 0, 1040, 0, 85};
  EXPECT_EQ(ranges(plan_units(layers, 80)), (Ranges{{0, 4}, {4, 6}}));
  EXPECT_EQ(plan_units(layers, 80)[0].numel, 1080);
  EXPECT_EQ(plan_units(layers, 80)[1].numel, 85);
  EXPECT_EQ(ranges(plan_units(layers, 100)), (Ranges{{0, 6}}));  // relu + fc left over: joined the last
  EXPECT_EQ(plan_units(layers, 100)[0].numel, 1165);
  EXPECT_EQ(ranges(plan_units(layers, 40)), (Ranges{{0, 1}, {1, 4}, {4, 6}}));
  EXPECT_EQ(ranges(plan_units(layers, 0)), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}}));
  EXPECT_EQ(ranges(plan_units(layers, 1 << 20)), (Ranges{{0, 6}}));  // none closed: one unit
  EXPECT_EQ(ranges(plan_units({}, 10)), Ranges{});
  EXPECT_NE(error_of([] { plan_units({1, -1}, 1); }).find("layer 1 has a negative size -1"),
            std::string::npos);
  EXPECT_NE(error_of([] { plan_units({1}, -1); }).find("must be >= 0 parameters, got -1"),
            std::string::npos);
}

// FSDP2's layout: each parameter cut along dim 0 in torch.chunk's pieces,
// a rank's pieces one after another in its block, each with room for a full
// chunk.
TEST(FsdpPlanTest, ShardsAreChunksOfEachParametersRows) {
  auto layout = plan_shards({{6, 2}, {4}, {}}, 4);  // 12 elements, 4, and a 0-dim one
  ASSERT_EQ(layout.parameters.size(), 3u);
  EXPECT_EQ(layout.parameters[0].chunk, 2);  // ceil(6 / 4) rows of 2
  EXPECT_EQ(layout.parameters[1].chunk, 1);
  EXPECT_EQ(layout.parameters[2].rows, 1);   // a 0-dim parameter is one row
  EXPECT_EQ(layout.parameters[2].chunk, 1);
  EXPECT_EQ(layout.parameters[0].shard_offset, 0);
  EXPECT_EQ(layout.parameters[1].shard_offset, 4);
  EXPECT_EQ(layout.parameters[2].shard_offset, 5);
  EXPECT_EQ(layout.shard, 6);
  EXPECT_EQ(layout.padded, 24);
  EXPECT_EQ(layout.parameters[1].full_offset, 16);  // 4 ranks x 2 rows of 2
  EXPECT_EQ(layout.parameters[2].full_offset, 20);
  EXPECT_EQ(layout.numel, 17);
  // torch.chunk(6 rows, 4): 2, 2, 2, none.
  EXPECT_EQ(layout.rows_of(0, 0), 2);
  EXPECT_EQ(layout.rows_of(0, 2), 2);
  EXPECT_EQ(layout.rows_of(0, 3), 0);
  EXPECT_EQ(layout.first_row(0, 3), 6);
  EXPECT_EQ(layout.rows_of(2, 0), 1);
  EXPECT_EQ(layout.rows_of(2, 1), 0);
  layout = plan_shards({}, 2);
  EXPECT_EQ(layout.padded, 0);
  EXPECT_NE(error_of([] { plan_shards({{1}}, 0); }).find("expected a world size >= 1, got 0"), std::string::npos);
  EXPECT_NE(error_of([] { plan_shards({{2, -1}}, 2); }).find("parameter 0 has a negative size -1"),
            std::string::npos);
}

// float64, so that the sums over ranks differ from one process's only in
// the last bits. An in-place ReLU begins a unit when every layer is one.
// With `nested`, the last three layers are a Sequence of their own ("head").

std::vector<torch::Tensor> reference(const models::Sequence& start, const Data& data) {
  auto net = make_net();
  copy_parameters(*start, *net);
  optim::Sgd sgd(net->parameters(), sgd_options());
  for (int s = 0; s < kSteps; ++s) {
    sgd.zero_grad();
    auto x = data.inputs.slice(0, s * kBatch, (s + 1) * kBatch);
    auto y = data.targets.slice(0, s * kBatch, (s + 1) * kBatch);
    torch::nn::functional::cross_entropy(net->forward(x), y).backward();
    sgd.step();
  }
  std::vector<torch::Tensor> out;
  for (auto& p : net->parameters()) out.push_back(p.detach().clone());
  return out;
}

// FSDP on `world` rank threads, each on its share of every batch (in
// `chunks` backward passes a step), against the reference.
void check_fsdp_equals_one_process(int world, FsdpOptions options, int64_t chunks = 1, bool nested = false) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net();
  auto expected = reference(start, data);
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net(false, nested);  // another start on every rank: FSDP broadcasts rank 0's...
    if (group->rank() == 0) copy_parameters(*start, *net);  // ...which is the reference's
    FullyShardedDataParallel fsdp(net, group, options);
    optim::Sgd sgd(fsdp.parameters(), sgd_options());
    const int64_t per_rank = kBatch / world;
    for (int s = 0; s < kSteps; ++s) {
      sgd.zero_grad();
      auto begin = s * kBatch + group->rank() * per_rank;
      auto x = data.inputs.slice(0, begin, begin + per_rank);
      auto y = data.targets.slice(0, begin, begin + per_rank);
      auto xs = x.tensor_split(chunks), ys = y.tensor_split(chunks);
      for (int64_t k = 0; k < chunks; ++k) {
        auto loss = torch::nn::functional::cross_entropy(fsdp.forward(xs[k]), ys[k]);
        (loss * (static_cast<double>(xs[k].size(0)) / per_rank)).backward();
      }
      fsdp.after_backward();
      EXPECT_EQ(fsdp.gathered_units(), 0) << "step " << s;  // Note [fully sharded parameters]
      sgd.step();
    }
    auto full = fsdp.full_params();
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i], expected[i], 1e-12, 1e-13))
          << "parameter " << i << " on rank " << group->rank() << ", max difference "
          << (params[i] - expected[i]).abs().max().item<double>();
    }
  });
  expect_no_errors(errors);
}

TEST(FsdpTest, TwoRanksEqualOneProcessOnTheWholeBatch) {
  check_fsdp_equals_one_process(2, {});
}

TEST(FsdpTest, EveryLayerAUnitOnThreeRanksWithOrWithoutPrefetch) {
  auto options = units_of_at_least(0);  // seven units, the parameter-free ones among them
  check_fsdp_equals_one_process(3, options);
  options.prefetch = false;
  check_fsdp_equals_one_process(3, options);
}

TEST(FsdpTest, KeepingParametersUntilBackwardGivesTheSameWeights) {
  auto options = units_of_at_least(50);
  options.reshard_after_forward = false;  // ZeRO-2
  check_fsdp_equals_one_process(2, options);
  check_fsdp_equals_one_process(4, options);
}

TEST(FsdpTest, OneRankIsPlainTraining) { check_fsdp_equals_one_process(1, {}); }

// Counts its forwards; an identity.
struct CountForwardsImpl : torch::nn::Cloneable<CountForwardsImpl> {
  explicit CountForwardsImpl(std::shared_ptr<std::atomic<int>> calls) : calls(std::move(calls)) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++*calls;
    return x;
  }
  std::shared_ptr<std::atomic<int>> calls;
};
TORCH_MODULE(CountForwards);

// Note [fsdp activation checkpointing]: every unit but the last recomputes
// its forward in backward; the weights stay one process's.
TEST(FsdpTest, CheckpointedUnitsRecomputeAndTrainTheSame) {
  auto options = units_of_at_least(0);
  options.checkpoint_activations = true;
  check_fsdp_equals_one_process(3, options);
  options = units_of_at_least(50);
  options.checkpoint_activations = true;
  options.reshard_after_forward = false;
  check_fsdp_equals_one_process(2, options, /*chunks=*/2);
  auto first = std::make_shared<std::atomic<int>>(0), last = std::make_shared<std::atomic<int>>(0);
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    models::Sequence net;
    net->push_back("count1", CountForwards(first));
    net->push_back("fc1", torch::nn::Linear(6, 8));
    net->push_back("count2", CountForwards(last));
    net->push_back("fc2", torch::nn::Linear(8, 8));
    auto options = units_of_at_least(40);
    options.checkpoint_activations = true;
    FullyShardedDataParallel fsdp(net, group, options);
    EXPECT_EQ(fsdp.describe_units(), "count1..fc1 | count2..fc2");
    fsdp.forward(torch::randn({4, 6})).sum().backward();
    fsdp.after_backward();
    for (const auto& shard : fsdp.parameters()) EXPECT_TRUE(shard.grad().defined());
  });
  expect_no_errors(errors);
  EXPECT_EQ(first->load(), 2 * 2);  // on each of the 2 ranks: forward, and again in backward
  EXPECT_EQ(last->load(), 2 * 1);
}

// Note [fsdp layers]: a nested Sequence is opened up into its layers, which
// units may then hold one by one; one that checkpoints segments stays whole.
TEST(FsdpTest, NestedSequencesAreOpenedUpIntoLayers) {
  auto options = units_of_at_least(0);
  check_fsdp_equals_one_process(2, options, 1, /*nested=*/true);
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net(false, /*nested=*/true);
    FullyShardedDataParallel fsdp(net, group, options);
    EXPECT_EQ(fsdp.describe_units(), "conv | relu1 | flatten | head.fc1 | head.relu2 | head.fc2");
    auto checkpointed = make_net(false, /*nested=*/true);
    std::dynamic_pointer_cast<models::SequenceImpl>(checkpointed->at(3).ptr())->checkpoint_segments({2, 1});
    options.min_unit_numel = 50;
    FullyShardedDataParallel whole(checkpointed, group, options);
    EXPECT_EQ(whole.describe_units(), "conv | relu1..head");
  });
  expect_no_errors(errors);
}

// Two backward passes before after_backward: the shards' gradients sum.
TEST(FsdpTest, GradientsAccumulateOverBackwardPasses) {
  auto options = units_of_at_least(50);
  check_fsdp_equals_one_process(2, options, /*chunks=*/3);
}

// Note [fully sharded parameters]: at rest each rank holds its shards only;
// the model's parameters are the same tensors, their memory released.
TEST(FsdpTest, AtRestOnlyShardsHoldMemory) {
  auto errors = run_ranks(3, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net();
    auto before = net->parameters();
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : before) shapes.push_back(p.sizes().vec());
    auto options = units_of_at_least(50);
    FullyShardedDataParallel fsdp(net, group, options);
    // conv (76) | relu1 flatten fc1 (1616) | relu2 fc2 (51)
    ASSERT_EQ(fsdp.units().size(), 3u);
    // One shard per parameter: this rank's torch.chunk of its rows (conv's
    // 4 rows as 2, 2 and none; fc1's 16 as 6, 6, 4).
    ASSERT_EQ(fsdp.parameters().size(), before.size());
    for (size_t i = 0; i < before.size(); ++i) {
      const auto& shard = fsdp.parameters()[i];
      EXPECT_TRUE(shard.requires_grad());
      EXPECT_TRUE(shard.is_leaf());
    }
    EXPECT_EQ(fsdp.parameters()[0].size(0), group->rank() < 2 ? 2 : 0);
    EXPECT_EQ(fsdp.parameters()[2].size(0), group->rank() < 2 ? 6 : 4);
    EXPECT_EQ(fsdp.gathered_units(), 0);
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(params[i].is_same(before[i]));  // the same tensors and names...
      EXPECT_EQ(params[i].numel(), 0);            // ...holding nothing
      EXPECT_EQ(params[i].storage().nbytes(), 0u);
    }
    {
      auto full = fsdp.full_params();
      EXPECT_EQ(fsdp.gathered_units(), 3);
      for (size_t i = 0; i < params.size(); ++i) {
        EXPECT_EQ(params[i].sizes().vec(), shapes[i]) << i;
        auto chunks = params[i].detach().chunk(3);
        const auto rank = static_cast<size_t>(group->rank());
        if (rank < chunks.size()) {
          EXPECT_TRUE(torch::equal(fsdp.parameters()[i], chunks[rank])) << i;
        } else {
          EXPECT_EQ(fsdp.parameters()[i].size(0), 0) << i;
        }
      }
      EXPECT_GT(params[0].storage().nbytes(), 0u);
      {
        auto nested = fsdp.full_params();
      }
      EXPECT_EQ(fsdp.gathered_units(), 3);  // the outer scope still holds them
    }
    EXPECT_EQ(fsdp.gathered_units(), 0);
    // Evaluation: gathered unit by unit, released again.
    net->eval();
    torch::NoGradGuard no_grad;
    auto out = fsdp.forward(torch::randn({2, 2, 5, 5}, torch::kFloat64));
    EXPECT_EQ(out.sizes(), (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(fsdp.gathered_units(), 0);
  });
  expect_no_errors(errors);
}

// What FSDP is for: a training step's peak of live memory. 8 units of
// Linear(512, 512) (1 MiB each) and 4 rows a rank, so the model, its
// gradients and its momentum are nearly all of it: under DDP every rank
// holds the 3 x 8 MiB (plus its buckets' gradient copies); under FSDP on 4
// ranks a rank holds a quarter of them plus at most two units gathered and
// two units' gradients at a time. The ranks are threads of this process, so
// the counts add up over the 4.
TEST(FsdpTest, ATrainingStepsPeakOfMemoryIsFarBelowDdps) {
  auto build = [] {
    models::Sequence net;
    for (int i = 0; i < 8; ++i) {
      net->push_back("fc" + std::to_string(i), torch::nn::Linear(512, 512));
      net->push_back("relu" + std::to_string(i), torch::nn::ReLU());
    }
    return net;
  };
  auto* base = c10::GetCPUAllocator();
  testing::CountingAllocator counting(base);
  c10::SetCPUAllocator(&counting, /*priority=*/100);
  const int world = 4;
  auto peak_of = [&](bool sharded) {
    std::atomic<int> warm{0};
    std::atomic<int64_t> peak{0};
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto net = build();
      std::unique_ptr<DistributedDataParallel> ddp;
      std::unique_ptr<FullyShardedDataParallel> fsdp;
      std::unique_ptr<optim::Sgd> sgd;
      if (sharded) {
        auto options = units_of_at_least(0);
        fsdp = std::make_unique<FullyShardedDataParallel>(net, group, options);
        sgd = std::make_unique<optim::Sgd>(fsdp->parameters(), sgd_options());
      } else {
        ddp = std::make_unique<DistributedDataParallel>(net.ptr(), group);
        sgd = std::make_unique<optim::Sgd>(net->parameters(), sgd_options());
      }
      auto x = torch::randn({4, 512});
      for (int s = 0; s < 3; ++s) {
        if (s == 2) {  // two steps made every buffer; the third is measured
          group->barrier().wait();
          if (++warm == world) counting.reset_peak();
          while (warm < world) std::this_thread::yield();
        }
        sgd->zero_grad();
        if (ddp) ddp->before_forward();
        (fsdp ? fsdp->forward(x) : net->forward(x)).pow(2).mean().backward();
        if (ddp) ddp->after_backward();
        if (fsdp) fsdp->after_backward();
        sgd->step();
      }
      group->barrier().wait();
      peak = counting.peak();
    });
    expect_no_errors(errors);
    return peak.load();
  };
  const int64_t ddp_peak = peak_of(false), fsdp_peak = peak_of(true);
  c10::SetCPUAllocator(base, /*priority=*/100);
  std::printf("peak of live memory over 4 ranks: %.1f MiB with DDP, %.1f MiB with FSDP\n",
              ddp_peak / 1048576.0, fsdp_peak / 1048576.0);
  // What DDP must hold: parameters, gradients and momentum on every rank
  // (measured: 111 to 128 MiB, as the ranks' steps overlap); FSDP measured
  // 51 MiB (its copies into and out of the ranks' blocks hold about a unit
  // more at a time), and 83 with every reduction left to the end of backward.
  const int64_t held_by_ddp = int64_t(4) * 24 * 1048576;
  EXPECT_GT(ddp_peak, held_by_ddp);
  EXPECT_LT(fsdp_peak, held_by_ddp * 6 / 10);
  EXPECT_LT(fsdp_peak, ddp_peak / 2);
}

// FullParams with write_back: values set on the model's parameters become
// the shards (how a checkpoint is loaded); without it they are dropped.

}  // namespace
}  // namespace tandem::parallel
