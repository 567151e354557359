// AdamW over FSDP's shards (parallel/fsdp_optimizer.h): the weights of
// plain AdamW in nanoGPT's decay groups, the shards grouped as their
// parameters are (Note [fsdp weight decay]), and the state in plain
// AdamW's form both ways (Note [fsdp optimizer state]).
#include "fsdp_fixture.h"

#include "tandem/optim/adamw.h"
#include "tandem/optim/state_tensors.h"

namespace tandem::parallel {
namespace {

torch::optim::AdamWOptions adamw_options() {
  return torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1);
}

std::vector<torch::Tensor> values_of(const models::Sequence& net) {
  std::vector<torch::Tensor> values;
  for (const auto& p : net->parameters()) values.push_back(p.detach().clone());
  return values;
}

double largest_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, (a[i] - b[i]).abs().max().item<double>());
  return largest;
}

// Units of at least 50 parameters: conv (weight and bias) with fc1's
// weight, and so on, shards cutting through parameters, on 2 and 3 ranks.
// The weights after 4 steps are plain AdamW's in decay groups to rounding;
// the control, AdamW decaying every parameter (biases too), is off by far
// more than the bound.
TEST(FsdpAdamWTest, ShardsStepAsPlainAdamWInDecayGroups) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net();
  auto reference = [&](bool groups) {
    auto net = make_net();
    copy_parameters(*start, *net);
    std::unique_ptr<optim::AdamW> adamw;
    if (groups) {
      adamw = std::make_unique<optim::AdamW>(optim::decay_groups(net->named_parameters(), adamw_options()),
                                             adamw_options());
    } else {
      adamw = std::make_unique<optim::AdamW>(net->parameters(), adamw_options());
    }
    for (int s = 0; s < kSteps; ++s) train_step(*adamw, [&](const torch::Tensor& x) { return net->forward(x); }, [] {}, data, s, 0, 1);
    return values_of(net);
  };
  const auto expected = reference(true);
  const auto every_parameter_decayed = reference(false);
  EXPECT_GT(largest_difference(every_parameter_decayed, expected), 1e-6) << "the control must fail the bound";
  for (int64_t world : {2, 3}) {
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto net = make_net();
      copy_parameters(*start, *net);
      FullyShardedDataParallel fsdp(net, group, units_of_at_least(50));
      FsdpAdamW adamw(fsdp, adamw_options());
      for (int s = 0; s < kSteps; ++s) {
        train_step(adamw, [&](const torch::Tensor& x) { return fsdp.forward(x); }, [&] { fsdp.after_backward(); },
                   data, s, group->rank(), world);
      }
      auto full = fsdp.full_params();
      EXPECT_LT(largest_difference(values_of(net), expected), 1e-12) << "rank " << group->rank() << " of " << world;
      // Its options are AdamW's as given: the weight decay stays 0.1 after the steps.
      EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(adamw.param_groups()[0].options()).weight_decay(), 0.1);
    });
    expect_no_errors(errors);
  }
}

// Saved on 2 ranks after 2 steps, the state is plain AdamW's over the
// model (its two groups, each parameter's step and moments); plain AdamW's
// state, loaded on 3 ranks, continues to the reference's weights.
TEST(FsdpAdamWTest, StateIsSavedAndLoadedInPlainAdamWsForm) {
  auto data = make_data();
  torch::manual_seed(1);
  auto start = make_net();
  testing::TempDir dir;
  auto net = make_net();
  copy_parameters(*start, *net);
  optim::AdamW plain(optim::decay_groups(net->named_parameters(), adamw_options()), adamw_options());
  auto forward = [&](const torch::Tensor& x) { return net->forward(x); };
  for (int s = 0; s < 2; ++s) train_step(plain, forward, [] {}, data, s, 0, 1);
  const auto half_weights = values_of(net);
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> half_state;
  for (const auto& p : net->parameters()) {
    half_state.emplace_back();
    for (const auto& [name, t] : optim::parameter_state(plain, p)) half_state.back().emplace_back(name, t.clone());
  }
  {
    torch::serialize::OutputArchive archive;
    plain.save(archive);
    archive.save_to(dir.file("plain.pt"));
  }
  for (int s = 2; s < kSteps; ++s) train_step(plain, forward, [] {}, data, s, 0, 1);
  const auto final_weights = values_of(net);

  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto mine = make_net();
    copy_parameters(*start, *mine);
    FullyShardedDataParallel fsdp(mine, group, units_of_at_least(50));
    FsdpAdamW sharded(fsdp, adamw_options());
    for (int s = 0; s < 2; ++s) {
      train_step(sharded, [&](const torch::Tensor& x) { return fsdp.forward(x); }, [&] { fsdp.after_backward(); },
                 data, s, group->rank(), 2);
    }
    torch::serialize::OutputArchive archive;
    if (group->rank() == 1) {
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
    optim::AdamW loaded(optim::decay_groups(reader->named_parameters(), adamw_options()), adamw_options());
    torch::serialize::InputArchive archive;
    archive.load_from(dir.file("fsdp.pt"));
    loaded.load(archive);
    auto params = reader->parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const auto state = optim::parameter_state(loaded, params[i]);
      ASSERT_EQ(state.size(), half_state[i].size()) << "parameter " << i;
      for (size_t k = 0; k < state.size(); ++k) {
        EXPECT_EQ(state[k].first, half_state[i][k].first);
        EXPECT_TRUE(torch::allclose(state[k].second.to(torch::kFloat64), half_state[i][k].second.to(torch::kFloat64),
                                    1e-10, 1e-13))
            << "parameter " << i << ", " << state[k].first;
      }
    }
  }
  errors = run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto mine = make_net();
    FullyShardedDataParallel fsdp(mine, group, units_of_at_least(0));
    FsdpAdamW sharded(fsdp, adamw_options());
    {
      auto full = fsdp.full_params(/*write_back=*/true);
      torch::NoGradGuard no_grad;
      auto params = mine->parameters();
      for (size_t i = 0; i < params.size(); ++i) params[i].copy_(half_weights[i]);
    }
    torch::serialize::InputArchive archive;
    archive.load_from(dir.file("plain.pt"));
    sharded.load(archive);
    for (int s = 2; s < kSteps; ++s) {
      train_step(sharded, [&](const torch::Tensor& x) { return fsdp.forward(x); }, [&] { fsdp.after_backward(); },
                 data, s, group->rank(), 3);
    }
    auto full = fsdp.full_params();
    EXPECT_LT(largest_difference(values_of(mine), final_weights), 1e-12) << "rank " << group->rank();
  });
  expect_no_errors(errors);
}

}  // namespace
}  // namespace tandem::parallel
