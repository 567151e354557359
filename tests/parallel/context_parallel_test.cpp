// Context parallelism's attention (Note [context parallelism] in
// parallel/context_parallel.h): the zig-zag chunks a rank holds, and ring
// attention equal to one process's causal attention, forward and backward,
// with the bytes it sends.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "tandem/parallel/context_parallel.h"
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

// On 2 and 4 thread ranks, each holding its chunks of q, k and v: the
// output and the three gradients are one process's rows at the rank's
// positions, in float64 to rounding. Control: a rank's own block alone
// (attention without the ring) is far from them. Traffic: what the note
// says, a block being [B, H, T/cp, D].
TEST(ContextParallelTest, RingAttentionIsOneProcesssCausalAttentionRowForRow) {
  for (int world : {2, 4}) {
    torch::manual_seed(5 + world);
    const int64_t batch = 2, heads = 3, tokens = 16, size = 8;
    const auto options = torch::TensorOptions().dtype(torch::kFloat64);
    auto q = torch::randn({batch, heads, tokens, size}, options), k = torch::randn_like(q), v = torch::randn_like(q);
    auto grad = torch::randn_like(q);
    auto qr = q.clone().requires_grad_(), kr = k.clone().requires_grad_(), vr = v.clone().requires_grad_();
    auto reference = at::scaled_dot_product_attention(qr, kr, vr, {}, 0.0, /*is_causal=*/true);
    reference.backward(grad);
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      const int64_t r = group->rank();
      auto part = [&](const torch::Tensor& t) { return context_part(t.detach(), 2, r, world); };
      auto ql = part(q).requires_grad_(), kl = part(k).requires_grad_(), vl = part(v).requires_grad_();
      group->reset_traffic();
      auto y = ring_attention(ql, kl, vl, group);
      y.backward(part(grad));
      const std::string at = "rank " + std::to_string(r) + " of " + std::to_string(world);
      EXPECT_LE(relative_difference(y, part(reference)), 1e-12) << at;
      EXPECT_LE(relative_difference(ql.grad(), part(qr.grad())), 1e-12) << at;
      EXPECT_LE(relative_difference(kl.grad(), part(kr.grad())), 1e-12) << at;
      EXPECT_LE(relative_difference(vl.grad(), part(vr.grad())), 1e-12) << at;
      const auto alone = at::scaled_dot_product_attention(ql, kl, vl, {}, 0.0, /*is_causal=*/true);
      EXPECT_GT(relative_difference(alone, part(reference)), 1e-2) << at << ": the control";
      const int64_t block = batch * heads * tokens / world * size * 8;
      EXPECT_EQ(group->traffic()["send"].bytes, (world - 1) * 2 * block + (world - 1) * 4 * block + 2 * block) << at;
    }));
  }
}

TEST(ContextParallelTest, OneRankIsThePlainAttention) {
  auto q = torch::randn({1, 2, 6, 4}, torch::kFloat64);
  EXPECT_TRUE(torch::equal(ring_attention(q, q, q, nullptr), at::scaled_dot_product_attention(q, q, q, {}, 0.0, true)));
}

}  // namespace
}  // namespace tandem::parallel
