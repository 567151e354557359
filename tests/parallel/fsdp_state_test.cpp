// FSDP's whole parameters and state: FullParams, shard-like tensors,
// BatchNorm, clipping over shards, the optimizer state in plain SGD's form,
// detaching, and the models it refuses.
#include "fsdp_fixture.h"

namespace tandem::parallel {
namespace {

TEST(FsdpTest, FullParamsWritesBackWhenAsked) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net();
    FullyShardedDataParallel fsdp(net, group);
    {
      auto full = fsdp.full_params(/*write_back=*/false);
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(7.0);
    }
    {
      auto full = fsdp.full_params();
      EXPECT_FALSE(torch::equal(net->parameters()[0], torch::full_like(net->parameters()[0], 7.0)));
    }
    {
      auto full = fsdp.full_params(/*write_back=*/true);
      torch::NoGradGuard no_grad;
      for (auto& p : net->parameters()) p.fill_(7.0);
    }
    auto full = fsdp.full_params();
    for (const auto& p : net->named_parameters()) {
      EXPECT_TRUE(torch::equal(p.value(), torch::full_like(p.value(), 7.0))) << p.key();
    }
  });
  expect_no_errors(errors);
}

// Tensors shaped like the shards (momentum) gathered into the parameters'
// shapes and cut again: the round trip is exact, strides included.
TEST(FsdpTest, ShardLikeTensorsGatherIntoParameterShapes) {
  auto errors = run_ranks(3, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net();
    {
      torch::NoGradGuard no_grad;  // a channels-last weight keeps its strides in the full buffer
      auto& w = net->named_parameters()["conv.weight"];
      w.set_data(w.data().contiguous(torch::MemoryFormat::ChannelsLast));
    }
    std::vector<torch::Tensor> values;  // the same on every rank, none alike
    double next = 0.5;
    for (const auto& p : net->parameters()) {
      values.push_back(torch::arange(next, next + p.numel(), torch::kFloat64).reshape(p.sizes()));
      next += p.numel();
    }
    auto options = units_of_at_least(0);
    FullyShardedDataParallel fsdp(net, group, options);
    auto shards = fsdp.shard_like_parameters(values);
    ASSERT_EQ(shards.size(), fsdp.parameters().size());
    for (size_t i = 0; i < shards.size(); ++i) EXPECT_EQ(shards[i].sizes(), fsdp.parameters()[i].sizes());
    auto back = fsdp.gather_like_parameters(shards);
    ASSERT_EQ(back.size(), values.size());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_TRUE(torch::equal(back[i], values[i])) << i;
    EXPECT_TRUE(back[0].is_contiguous(torch::MemoryFormat::ChannelsLast));
    EXPECT_NE(error_of([&] { fsdp.gather_like_parameters({shards[0]}); }).find("expected 6 tensors shaped like the shards, got 1"),
              std::string::npos);
  });
  expect_no_errors(errors);
}

// With BatchNorm each rank normalises over its own share, so the reference
// is DDP over the same shares: the same weights and running statistics
// (rank 0's, broadcast before every forward by both).
// With checkpointed units too: BatchNorm's statistics are put back after
// the recomputation, so they are updated once a step, as under DDP.
TEST(FsdpTest, WithBatchNormItTrainsAsDdp) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net(/*batch_norm=*/true);
  const int world = 2;
  for (bool checkpointed : {false, true}) {
  SCOPED_TRACE(checkpointed ? "checkpointed units" : "plain units");
  std::vector<std::vector<torch::Tensor>> ddp_state(world), fsdp_state(world);
  for (bool sharded : {false, true}) {
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto net = make_net(/*batch_norm=*/true);
      copy_parameters(*start, *net);
      std::unique_ptr<DistributedDataParallel> ddp;
      std::unique_ptr<FullyShardedDataParallel> fsdp;
      std::unique_ptr<optim::Sgd> sgd;
      if (sharded) {
        auto options = units_of_at_least(0);
        options.checkpoint_activations = checkpointed;
        fsdp = std::make_unique<FullyShardedDataParallel>(net, group, options);
        sgd = std::make_unique<optim::Sgd>(fsdp->parameters(), sgd_options());
      } else {
        ddp = std::make_unique<DistributedDataParallel>(net.ptr(), group);
        sgd = std::make_unique<optim::Sgd>(net->parameters(), sgd_options());
      }
      const int64_t per_rank = kBatch / world;
      for (int s = 0; s < kSteps; ++s) {
        sgd->zero_grad();
        auto begin = s * kBatch + group->rank() * per_rank;
        auto x = data.inputs.slice(0, begin, begin + per_rank);
        auto y = data.targets.slice(0, begin, begin + per_rank);
        if (ddp) ddp->before_forward();
        auto logits = fsdp ? fsdp->forward(x) : net->forward(x);
        torch::nn::functional::cross_entropy(logits, y).backward();
        if (ddp) ddp->after_backward();
        if (fsdp) fsdp->after_backward();
        sgd->step();
      }
      std::optional<FullyShardedDataParallel::FullParams> full;
      if (fsdp) full.emplace(*fsdp, false);
      auto& out = (sharded ? fsdp_state : ddp_state)[group->rank()];
      for (const auto& p : net->parameters()) out.push_back(p.detach().clone());
      for (const auto& b : net->buffers()) out.push_back(b.detach().clone());
    });
    expect_no_errors(errors);
  }
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(fsdp_state[r].size(), ddp_state[r].size());
    for (size_t i = 0; i < ddp_state[r].size(); ++i) {
      EXPECT_TRUE(torch::allclose(fsdp_state[r][i], ddp_state[r][i], 1e-12, 1e-13))
          << "tensor " << i << " on rank " << r;
    }
  }
  }
}

// --clip-grad-norm under FSDP: the norm of the whole gradient from the
// shards' parts, the same clipped step as one process.
TEST(FsdpTest, ClippingShardedGradientsUsesTheWholeNorm) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net();
  auto x = data.inputs.slice(0, 0, kBatch), y = data.targets.slice(0, 0, kBatch);
  auto net = make_net();
  copy_parameters(*start, *net);
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  auto norm = optim::clip_grad_norm(net->parameters(), 0.05);
  std::vector<torch::Tensor> clipped;
  for (const auto& p : net->parameters()) clipped.push_back(p.grad().clone());
  auto errors = run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto mine = make_net();
    copy_parameters(*start, *mine);
    auto options = units_of_at_least(50);
    FullyShardedDataParallel fsdp(mine, group, options);
    const int64_t per_rank = kBatch / 3, begin = group->rank() * per_rank;
    torch::nn::functional::cross_entropy(fsdp.forward(x.slice(0, begin, begin + per_rank)),
                                         y.slice(0, begin, begin + per_rank))
        .backward();
    fsdp.after_backward();
    auto sharded_norm = optim::clip_grad_norm(fsdp.parameters(), 0.05, &fsdp.group());
    EXPECT_NEAR(sharded_norm.item<double>(), norm.item<double>(), 1e-12);
    std::vector<torch::Tensor> grads;
    for (const auto& s : fsdp.parameters()) grads.push_back(s.grad());
    auto whole = fsdp.gather_like_parameters(grads);
    for (size_t i = 0; i < whole.size(); ++i) {
      EXPECT_TRUE(torch::allclose(whole[i], clipped[i], 1e-10, 1e-13)) << "gradient " << i;
    }
  });
  expect_no_errors(errors);
}

// Note [fsdp optimizer state]: FsdpSgd writes plain Sgd's state over the
// whole model, and reads one (from any run) into its shards.
TEST(FsdpTest, OptimizerStateIsSavedAndLoadedInPlainSgdsForm) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net();
  testing::TempDir dir;
  // The reference: one process, 2 steps, saved, 2 more.
  auto net = make_net();
  copy_parameters(*start, *net);
  optim::Sgd sgd(net->parameters(), sgd_options());
  auto plain = [&](const torch::Tensor& x) { return net->forward(x); };
  for (int s = 0; s < 2; ++s) train_step(sgd, plain, [] {}, data, s, 0, 1);
  std::vector<torch::Tensor> half_weights, half_momentum, final_weights;
  for (const auto& p : net->parameters()) {
    half_weights.push_back(p.detach().clone());
    half_momentum.push_back(static_cast<torch::optim::SGDParamState&>(*sgd.state().at(p.unsafeGetTensorImpl()))
                                .momentum_buffer().clone());
  }
  {
    torch::serialize::OutputArchive archive;
    sgd.save(archive);
    archive.save_to(dir.file("plain.pt"));
  }
  for (int s = 2; s < kSteps; ++s) train_step(sgd, plain, [] {}, data, s, 0, 1);
  for (const auto& p : net->parameters()) final_weights.push_back(p.detach().clone());

  // FSDP on 2 ranks, 2 steps, saved by rank 0: plain Sgd reads the reference's momentum.
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto mine = make_net();
    copy_parameters(*start, *mine);
    auto options = units_of_at_least(50);
    FullyShardedDataParallel fsdp(mine, group, options);
    FsdpSgd sharded(fsdp, sgd_options());
    for (int s = 0; s < 2; ++s) {
      train_step(sharded, [&](const torch::Tensor& x) { return fsdp.forward(x); },
                 [&] { fsdp.after_backward(); }, data, s, group->rank(), 2);
    }
    torch::serialize::OutputArchive archive;
    if (group->rank() == 1) {  // before consolidating: refused by name
      EXPECT_NE(error_of([&] { sharded.save(archive); }).find("call consolidate_state() on every rank first"),
                std::string::npos);
    }
    sharded.consolidate_state();
    if (group->rank() == 0) {
      sharded.save(archive);
      archive.save_to(dir.file("fsdp.pt"));
    }
  });
  expect_no_errors(errors);
  {
    auto reader = make_net();
    optim::Sgd loaded(reader->parameters(), sgd_options());
    torch::serialize::InputArchive archive;
    archive.load_from(dir.file("fsdp.pt"));
    loaded.load(archive);
    auto params = reader->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& m = static_cast<torch::optim::SGDParamState&>(*loaded.state().at(params[i].unsafeGetTensorImpl()))
                          .momentum_buffer();
      EXPECT_TRUE(torch::allclose(m, half_momentum[i], 1e-12, 1e-13)) << "momentum " << i;
    }
  }
  // FSDP on 3 ranks from the plain checkpoint: the last 2 steps as the reference's.
  errors = run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto mine = make_net();
    auto options = units_of_at_least(0);
    FullyShardedDataParallel fsdp(mine, group, options);
    FsdpSgd sharded(fsdp, sgd_options());
    {
      auto full = fsdp.full_params(/*write_back=*/true);
      copy_parameters(*start, *mine);  // overwritten next: only the shapes matter
      torch::NoGradGuard no_grad;
      auto params = mine->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(half_weights[i]);
    }
    torch::serialize::InputArchive archive;
    archive.load_from(dir.file("plain.pt"));
    sharded.load(archive);
    for (int s = 2; s < kSteps; ++s) {
      train_step(sharded, [&](const torch::Tensor& x) { return fsdp.forward(x); },
                 [&] { fsdp.after_backward(); }, data, s, group->rank(), 3);
    }
    auto full = fsdp.full_params();
    auto params = mine->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(torch::allclose(params[i], final_weights[i], 1e-12, 1e-13))
          << "parameter " << i << " on rank " << group->rank();
    }
  });
  expect_no_errors(errors);
}

// detach_model(): the model holds its full values again and trains plainly.
TEST(FsdpTest, DetachingGivesTheModelItsWeights) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto net = make_net();
    std::vector<torch::Tensor> before;
    for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
    FullyShardedDataParallel fsdp(net, group);  // rank 0's weights on both
    before.clear();
    {
      auto full = fsdp.full_params();
      for (const auto& p : net->parameters()) before.push_back(p.detach().clone());
    }
    fsdp.detach_model();
    auto params = net->parameters();
    for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], before[i])) << i;
    EXPECT_EQ(fsdp.gathered_units(), 0);
    net->forward(torch::randn({2, 2, 5, 5}, torch::kFloat64)).sum().backward();
    for (const auto& p : params) EXPECT_TRUE(p.grad().defined());  // plain autograd, no hooks
    EXPECT_NE(error_of([&] { fsdp.forward(torch::randn({2, 2, 5, 5}, torch::kFloat64)); })
                  .find("forward() after detach_model()"),
              std::string::npos);
  });
  expect_no_errors(errors);
}

TEST(FsdpTest, FrozenParametersAndMixedUnitsAreNamed) {
  auto errors = run_ranks(2, [](std::shared_ptr<dist::ProcessGroup> group) {
    auto frozen = make_net();
    frozen->named_parameters()["fc1.bias"].set_requires_grad(false);
    EXPECT_NE(error_of([&] { FullyShardedDataParallel fsdp(frozen, group); })
                  .find("parameter 'fc1.bias' does not require a gradient"),
              std::string::npos);
    auto mixed = make_net();
    mixed->at(mixed->size() - 1).ptr()->to(torch::kFloat32);
    EXPECT_NE(error_of([&] { FullyShardedDataParallel fsdp(mixed, group); })
                  .find("layer 'fc2' has a parameter of Float on cpu, unlike the rest of its unit "
                        "(Double on cpu)"),
              std::string::npos);
    // A model that FSDP refused is left as it was, with no hook of the
    // failed object on its gradients (the units before the mixed one had
    // been built).
    auto later = make_net();  // the last of 3 units mixed: fc2's weight in float32, its bias in float64
    auto weight = later->named_parameters()["fc2.weight"];
    weight.set_data(weight.data().to(torch::kFloat32));
    EXPECT_NE(error_of([&] { FullyShardedDataParallel fsdp(later, group, units_of_at_least(50)); })
                  .find("layer 'fc2' has a parameter of Double on cpu, unlike the rest of its unit (Float"),
              std::string::npos);
    weight.set_data(weight.data().to(torch::kFloat64));
    later->forward(torch::randn({2, 2, 5, 5}, torch::kFloat64)).sum().backward();
    for (const auto& p : later->parameters()) EXPECT_TRUE(p.grad().defined());
  });
  expect_no_errors(errors);
}

}  // namespace
}  // namespace tandem::parallel
