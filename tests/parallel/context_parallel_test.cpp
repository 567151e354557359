// Context parallelism's attention (Note [context parallelism] in
// parallel/context_parallel.h): the zig-zag chunks a rank holds, and ring
// attention equal to one process's causal attention, forward and backward,
// with the bytes it sends.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/parallel/context_parallel.h"
#include "counting_allocator.h"
#include "testing.h"

namespace tandem::parallel {
namespace {

double relative_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return ((a - b).abs().max() / b.abs().max()).item<double>();
}

TEST(ContextParallelTest, EachRankHoldsAnEarlyAndALateChunk) {
  EXPECT_TRUE(torch::equal(context_positions(16, 1, 4), torch::tensor({2, 3, 12, 13}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(context_positions(8, 0, 2), torch::tensor({0, 1, 6, 7}, torch::kInt64)));
  auto t = torch::arange(8).view({1, 8});
  EXPECT_TRUE(torch::equal(context_part(t, 1, 1, 2), torch::tensor({{2, 3, 4, 5}})));
  EXPECT_EQ(testing::error_of([] { context_positions(12, 0, 4); }),
            "context parallelism over 4 ranks cuts each sequence into 8 equal chunks: a sequence of 12 tokens does "
            "not divide; use a length that 8 divides");
}

// On 2 and 4 thread ranks, each holding its chunks of q, k and v (as many
// key/value heads as query heads, or fewer, grouped): the output and the
// three gradients are one process's rows at the rank's positions, in
// float64 to rounding. Control: a rank's own block alone
// (attention without the ring) is far from them. Traffic: what the note
// says, a block being [B, H, T/cp, D].
TEST(ContextParallelTest, RingAttentionIsOneProcesssCausalAttentionRowForRow) {
  for (const auto& cell : std::vector<std::pair<int, int64_t>>{{2, 4}, {4, 4}, {2, 2}, {4, 1}}) {
    const int world = cell.first;
    const int64_t kv_heads = cell.second;
    torch::manual_seed(5 + world);
    const int64_t batch = 2, heads = 4, tokens = 16, size = 8;
    const auto options = torch::TensorOptions().dtype(torch::kFloat64);
    auto q = torch::randn({batch, heads, tokens, size}, options);
    auto k = torch::randn({batch, kv_heads, tokens, size}, options), v = torch::randn_like(k);
    auto grad = torch::randn_like(q);
    auto qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
    auto reference = at::scaled_dot_product_attention(qr, kr.repeat_interleave(heads / kv_heads, 1),
                                                      vr.repeat_interleave(heads / kv_heads, 1), {}, 0.0,
                                                      /*is_causal=*/true);
    reference.backward(grad);
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      const int64_t r = group->rank();
      auto part = [&](const torch::Tensor& t) { return context_part(t.detach(), 2, r, world); };
      auto ql = part(q).requires_grad_(), kl = part(k).requires_grad_(), vl = part(v).requires_grad_();
      group->reset_traffic();
      auto y = ring_attention(ql, kl, vl, group);
      y.backward(part(grad));
      const std::string at = "rank " + std::to_string(r) + " of " + std::to_string(world) + ", " +
                             std::to_string(kv_heads) + " key/value heads";
      EXPECT_LE(relative_difference(y, part(reference)), 1e-12) << at;
      EXPECT_LE(relative_difference(ql.grad(), part(qr.grad())), 1e-12) << at;
      EXPECT_LE(relative_difference(kl.grad(), part(kr.grad())), 1e-12) << at;
      EXPECT_LE(relative_difference(vl.grad(), part(vr.grad())), 1e-12) << at;
      const auto alone = at::scaled_dot_product_attention(ql, kl.repeat_interleave(heads / kv_heads, 1),
                                                          vl.repeat_interleave(heads / kv_heads, 1), {}, 0.0,
                                                          /*is_causal=*/true);
      EXPECT_GT(relative_difference(alone, part(reference)), 1e-2) << at << ": the control";
      const int64_t block = batch * kv_heads * tokens / world * size * 8;  // the key/value heads travel
      EXPECT_EQ(group->traffic()["send"].bytes, (world - 1) * 2 * block + (world - 1) * 4 * block + 2 * block) << at;
    }));
  }
}

// A model cut over cp ranks (split_context): each rank runs its zig-zag
// part of every sequence, and the mean of the ranks' losses over their
// tokens, with their gradients averaged, is one process's on the whole
// batch, in float64 to rounding: GPT-2 (learned positions) and LLaMA
// (rotary angles, grouped key/value heads) at cp=2 and cp=4. Control: the
// same parts without the cut (each rank's tokens as a sequence of their
// own) are far from it.
TEST(ContextParallelTest, AModelCutOverTheSequenceIsOneProcess) {
  for (const std::string name : {"gpt2-tiny", "llama-tiny"}) {
    auto build = [&] {
      torch::manual_seed(11);
      auto model = name == "gpt2-tiny" ? models::gpt2(models::Gpt2Config::preset(name))
                                       : models::llama(models::LlamaConfig::preset(name));
      model->to(torch::kFloat64);
      return model;
    };
    const int64_t batch = 2, tokens = 16;
    torch::manual_seed(12);
    const auto input = torch::randint(0, 200, {batch, tokens}, torch::kInt64);
    const auto target = torch::randint(0, 200, {batch, tokens}, torch::kInt64);
    auto loss_of = [](const torch::Tensor& logits, const torch::Tensor& labels) {
      return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}));
    };
    auto reference = build();
    const double reference_loss = [&] {
      auto loss = loss_of(reference->forward(input), target);
      loss.backward();
      return loss.item<double>();
    }();
    for (int world : {2, 4}) {
      std::vector<models::Sequence> built;  // here: the ranks' threads share the default generator
      for (int r = 0; r < 2 * world; ++r) built.push_back(build());
      testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
        const int64_t r = group->rank();
        const std::string at = name + ", rank " + std::to_string(r) + " of cp=" + std::to_string(world);
        auto control = built[static_cast<size_t>(2 * r)];
        auto control_loss = loss_of(control->forward(context_part(input, 1, r, world)),
                                    context_part(target, 1, r, world));
        auto model = built[static_cast<size_t>(2 * r + 1)];
        split_context(model, group);
        auto loss = loss_of(model->forward(context_part(input, 1, r, world)), context_part(target, 1, r, world));
        loss.backward();
        auto mean = loss.detach().clone();
        group->all_reduce(mean).wait();
        EXPECT_NEAR(mean.item<double>() / world, reference_loss, 1e-12 * reference_loss) << at;
        const auto want = reference->named_parameters();
        double worst = 0;
        for (const auto& p : model->named_parameters()) {
          auto g = p.value().grad().clone();
          group->all_reduce(g).wait();
          g.div_(world);
          const auto& w = want[p.key()].grad();
          worst = std::max(worst, relative_difference(g, w));
        }
        EXPECT_LE(worst, 1e-10) << at;
        control_loss.backward();
        double control_worst = 0;
        for (const auto& p : control->named_parameters()) {
          auto g = p.value().grad().clone();
          group->all_reduce(g).wait();
          control_worst = std::max(control_worst, relative_difference(g.div_(world), want[p.key()].grad()));
        }
        EXPECT_GT(control_worst, 1e-2) << at << ": the control";
      }));
    }
  }
}

// What context parallelism is for: llama-tiny (a vocabulary of 256) on one
// sequence of 8192 tokens, forward and backward, holds its activations
// for the whole sequence in one process; cut over cp=4 ranks each holds
// those of a quarter, plus its weights' gradients and the ring's blocks
// in flight. The ranks are threads, so the counting allocator's peak is
// their sum: a rank's is a quarter of it (measured: 388.8 MiB and 94.5
// MiB, 4.12x).
TEST(ContextParallelTest, ARankHoldsAboutAQuarterOfTheActivationsAtCpFour) {
  const int world = 4;
  const int64_t tokens = 8192;
  auto config = models::LlamaConfig::preset("llama-tiny");
  config.vocab_size = 256;
  config.max_positions = tokens;
  std::vector<models::Sequence> built;
  for (int r = 0; r <= world; ++r) {
    torch::manual_seed(3);
    built.push_back(models::llama(config));
  }
  torch::manual_seed(4);
  const auto input = torch::randint(0, 256, {1, tokens}, torch::kInt64);
  const auto target = torch::randint(0, 256, {1, tokens}, torch::kInt64);
  auto step = [](models::Sequence& model, const torch::Tensor& x, const torch::Tensor& y) {
    auto logits = model->forward(x);
    torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), y.reshape({-1})).backward();
  };
  testing::CountingCpuAllocator counting;
  counting->reset_peak();
  int64_t before = counting->live();
  step(built[0], input, target);
  const int64_t one_process = counting->peak() - before;
  testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    const int64_t r = group->rank();
    auto& model = built[static_cast<size_t>(r + 1)];
    split_context(model, group);
    const auto x = context_part(input, 1, r, world), y = context_part(target, 1, r, world);
    group->barrier().wait();
    if (r == 0) {
      counting->reset_peak();
      before = counting->live();
    }
    group->barrier().wait();
    step(model, x, y);
  }));
  const double per_rank = static_cast<double>(counting->peak() - before) / world;
  built.clear();  // their gradients were counted: freed while the counter is
  std::printf("llama-tiny on %lld tokens, forward and backward: %.1f MiB in one process, %.1f MiB a rank at cp=%d "
              "(%.2fx)\n",
              static_cast<long long>(tokens), one_process / 1048576.0, per_rank / 1048576.0, world,
              one_process / per_rank);
  EXPECT_GT(one_process / per_rank, 3.5);
}

TEST(ContextParallelTest, OneRankIsThePlainAttention) {
  auto q = torch::randn({1, 2, 6, 4}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(ring_attention(q, q, q, nullptr), at::scaled_dot_product_attention(q, q, q, {}, 0.0, true)));
}

}  // namespace
}  // namespace tandem::parallel
