// Expert parallelism (Note [expert dispatch] in parallel/expert_parallel.h),
// the ranks as threads over Gloo: a mixture-of-experts layer whose 8
// experts are spread over 2 or 4 ranks, each rank routing its own part of
// a batch, gives one process's outputs row for row and one process's
// gradients in float64: each rank's experts' gradients are one process's
// gradients of those experts (every token they served, from every rank),
// and the router's summed over the ranks are one process's. Control: its
// tokens through its own experts only (no dispatch)
// differs past the bound. The all-to-all carries exactly the rows that
// leave the rank.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <utility>

#include <torch/torch.h>

#include "tandem/models/llama.h"
#include "tandem/models/moe.h"
#include "tandem/parallel/context_parallel.h"
#include "tandem/parallel/expert_parallel.h"
#include "testing.h"

namespace tandem::parallel {
namespace expert_parallel_test {  // the file's own names (a layer's tests compile as one unit)

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

models::SparseMoe make_layer() {
  torch::manual_seed(21);
  models::SparseMoe moe(models::MoeConfig{/*hidden=*/16, /*intermediate=*/12, /*experts=*/8, /*top_k=*/2});
  moe->to(torch::kFloat64);
  return moe;
}

TEST(ExpertParallelTest, SpreadExpertsAreOneProcessRowForRow) {
  for (const int world : {2, 4}) {
    torch::manual_seed(7);
    const auto x = torch::randn({8, 6, 16}, torch::kFloat64), grad = torch::randn_like(x);
    auto whole = make_layer();
    const auto xr = x.clone().requires_grad_();
    const auto reference = whole->forward(xr);
    reference.backward(grad);
    const auto router_grad = whole->gate->weight.grad();
    std::mutex mutex;
    auto router_sum = torch::zeros_like(router_grad);
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      const int64_t r = group->rank(), rows = 8 / world;
      auto layer = [&] {
        std::lock_guard<std::mutex> lock(mutex);  // the default generator, shared by the threads
        return make_layer();
      }();
      spread_experts(*layer, group);
      const std::string at = "rank " + std::to_string(r) + " of " + std::to_string(world);
      ASSERT_EQ(layer->experts->gate_proj.size(0), 8 / world) << at;
      const auto mine = x.slice(0, r * rows, (r + 1) * rows).clone().requires_grad_();
      group->reset_traffic();
      auto y = layer->forward(mine);
      y.backward(grad.slice(0, r * rows, (r + 1) * rows));
      EXPECT_LE(relative_difference(y, reference.slice(0, r * rows, (r + 1) * rows)), 1e-12) << at;
      EXPECT_LE(relative_difference(mine.grad(), xr.grad().slice(0, r * rows, (r + 1) * rows)), 1e-12) << at;
      const int64_t held = 8 / world;
      for (auto [got, want] : {std::pair{&layer->experts->gate_proj, &whole->experts->gate_proj},
                               std::pair{&layer->experts->up_proj, &whole->experts->up_proj},
                               std::pair{&layer->experts->down_proj, &whole->experts->down_proj}}) {
        EXPECT_LE(relative_difference(got->grad(), want->grad().slice(0, r * held, (r + 1) * held)), 1e-12) << at;
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        router_sum += layer->gate->weight.grad();
      }
      // The rows that left, of 16 float64s: forward, this rank's (token, expert) pairs whose expert is
      // elsewhere, and the results of the other ranks' pairs its experts served; backward, the gradients of
      // both the other way. And the counts: one int64 per expert held elsewhere.
      const auto owner = whole->gate->route(x.reshape({-1, 16})).experts.div(held, "floor").view({world, -1});
      const int64_t away = (owner[r] != r).sum().item<int64_t>();
      const int64_t served = (owner == r).sum().item<int64_t>() - (owner[r] == r).sum().item<int64_t>();
      EXPECT_EQ(group->traffic()["all_to_all"].bytes, 2 * (away + served) * 16 * 8 + (8 - held) * 8) << at;
      // The control: its tokens through this rank's experts alone (the others' weights zero), as a layer
      // that kept its tokens would compute them.
      auto alone = [&] {
        std::lock_guard<std::mutex> lock(mutex);
        return std::dynamic_pointer_cast<models::SparseMoeImpl>(whole->clone());
      }();
      {
        torch::NoGradGuard no_grad;
        for (auto* w : {&alone->experts->gate_proj, &alone->experts->up_proj, &alone->experts->down_proj}) {
          w->slice(0, 0, r * held).zero_();
          w->slice(0, (r + 1) * held).zero_();
        }
      }
      EXPECT_GT(relative_difference(alone->forward(mine), reference.slice(0, r * rows, (r + 1) * rows)), 1e-3)
          << at << ": the control";
    }));
    EXPECT_LE(relative_difference(router_sum, router_grad), 1e-12) << world << " ranks";
  }
}

// ep over the ranks of a cp group (each holding part of every sequence):
// mixtral-tiny's logits at each rank's positions are one process's.
TEST(ExpertParallelTest, ComposesWithContextParallelism) {
  auto build = [] {
    torch::manual_seed(11);
    auto config = models::LlamaConfig::preset("mixtral-tiny");
    config.vocab_size = 64;
    auto model = models::llama(config);
    model->to(torch::kFloat64);
    return model;
  };
  torch::manual_seed(12);
  const auto input = torch::randint(0, 64, {2, 16}, torch::kInt64);
  auto whole = build();
  const auto reference = whole->forward(input);
  std::mutex mutex;
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto model = [&] {
      std::lock_guard<std::mutex> lock(mutex);
      return build();
    }();
    split_context(model, group);
    auto ep = group->split("ep", {0, 1});
    for (const auto& m : model->modules(false)) {
      if (auto* moe = dynamic_cast<models::SparseMoeImpl*>(m.get())) spread_experts(*moe, ep);
    }
    const int64_t r = group->rank();
    auto logits = model->forward(context_part(input, 1, r, 2));
    EXPECT_LE(relative_difference(logits, context_part(reference, 1, r, 2)), 1e-12) << "rank " << r;
  }));
}

TEST(ExpertParallelTest, RanksThatDoNotDivideTheExpertsAreRefused) {
  testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto layer = make_layer();
    EXPECT_EQ(testing::error_of([&] { spread_experts(*layer, group); }),
              "expert parallelism: 3 ranks do not divide the model's 8 experts (ep must divide the experts)");
  }));
}

}  // namespace expert_parallel_test
}  // namespace tandem::parallel
