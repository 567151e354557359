// Tensor parallelism's operators and layers (parallel/tensor_parallel.h)
// on 2 and 3 thread ranks over Gloo, against the whole layers in one
// process, in float64: outputs, the input's gradient and each shard's
// gradient (the whole gradient's rows or columns) to rounding. Sizes that
// tp does not divide are among them.
#include <gtest/gtest.h>

#include <torch/torch.h>

#include "tandem/parallel/tensor_parallel.h"
#include "testing.h"

namespace tandem::parallel::tp {
namespace {

using testing::expect_no_errors;
using testing::run_ranks;

constexpr double kTight = 1e-12;

double difference(const torch::Tensor& a, const torch::Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  if (a.sizes() != b.sizes()) return 1e300;
  return (a - b).abs().max().item<double>();
}

struct Mlp {
  torch::Tensor x, up_w, up_b, down_w, down_b, target;
};

Mlp make_mlp(int64_t hidden) {
  torch::manual_seed(3);
  auto o = torch::TensorOptions().dtype(torch::kFloat64);
  return {torch::randn({2, 6, 5}, o), torch::randn({hidden, 5}, o), torch::randn({hidden}, o),
          torch::randn({5, hidden}, o), torch::randn({5}, o), torch::randn({2, 6, 5}, o)};
}

// The whole MLP in one process: output and gradients.
struct Whole {
  torch::Tensor y, dx, dup_w, dup_b, ddown_w, ddown_b;
};
Whole whole_mlp(const Mlp& m) {
  auto x = m.x.clone().requires_grad_(true);
  auto up_w = m.up_w.clone().requires_grad_(true), up_b = m.up_b.clone().requires_grad_(true);
  auto down_w = m.down_w.clone().requires_grad_(true), down_b = m.down_b.clone().requires_grad_(true);
  auto y = torch::linear(torch::gelu(torch::linear(x, up_w, up_b)), down_w, down_b);
  (y * m.target).sum().backward();
  return {y.detach(), x.grad(), up_w.grad(), up_b.grad(), down_w.grad(), down_b.grad()};
}

// Column then row: the whole MLP's output on every rank, one all-reduce
// each way; the shards' gradients are the whole gradients' rows and
// columns. 10 hidden features over 3 ranks: parts of 4, 4 and 2.
TEST(TensorParallelTest, ColumnThenRowIsTheWholeMlp) {
  for (int64_t world : {2, 3}) {
    const auto m = make_mlp(10);
    const auto expected = whole_mlp(m);
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      ColumnParallelLinear up(m.up_w, m.up_b, group);
      RowParallelLinear down(m.down_w, m.down_b, group);
      auto x = m.x.clone().requires_grad_(true);
      auto y = down(torch::gelu(up(x)));
      (y * m.target).sum().backward();
      const auto part = part_of(10, group->rank(), world);
      EXPECT_LT(difference(y, expected.y), kTight);
      EXPECT_LT(difference(x.grad(), expected.dx), kTight);
      EXPECT_LT(difference(up->weight.grad(), expected.dup_w.narrow(0, part.begin, part.size())), kTight);
      EXPECT_LT(difference(up->bias.grad(), expected.dup_b.narrow(0, part.begin, part.size())), kTight);
      EXPECT_LT(difference(down->weight.grad(), expected.ddown_w.narrow(1, part.begin, part.size())), kTight);
      EXPECT_LT(difference(down->bias.grad(), expected.ddown_b), kTight);  // whole, and the same on every rank
      EXPECT_EQ(up->weight.size(0), part.size());  // each rank holds its part only
    });
    expect_no_errors(errors);
  }
}

// Note [sequence parallel]: the input split along the sequence (6
// positions: 3 or 2 per rank), gathered before the column layer and
// reduce-scattered after the row layer: each rank's output is its part of
// the whole output's sequence, and the input's gradient its part of the
// whole one. The row layer's bias now sees 1/tp of the positions: its
// gradients summed over the ranks are the whole gradient.
TEST(TensorParallelTest, SequenceParallelIsTheWholeMlpsSequenceParts) {
  for (int64_t world : {2, 3}) {
    const auto m = make_mlp(12);
    const auto expected = whole_mlp(m);
    auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      TensorParallelOptions sp;
      sp.sequence_parallel = true;
      ColumnParallelLinear up(m.up_w, m.up_b, group, sp);
      RowParallelLinear down(m.down_w, m.down_b, group, sp);
      auto x = m.x.clone().requires_grad_(true);
      auto mine = split_sequence(x, *group, 1);
      EXPECT_EQ(mine.size(1), 6 / world);
      auto y = down(torch::gelu(up(mine)));
      const auto rows = part_of(6, group->rank(), world);
      (y * m.target.narrow(1, rows.begin, rows.size())).sum().backward();
      EXPECT_LT(difference(y, expected.y.narrow(1, rows.begin, rows.size())), kTight);
      EXPECT_LT(difference(x.grad(), expected.dx), kTight);  // split_sequence's backward gathers it whole
      const auto part = part_of(12, group->rank(), world);
      EXPECT_LT(difference(up->weight.grad(), expected.dup_w.narrow(0, part.begin, part.size())), kTight);
      EXPECT_LT(difference(down->weight.grad(), expected.ddown_w.narrow(1, part.begin, part.size())), kTight);
      auto bias_grad = down->bias.grad().clone();
      group->all_reduce(bias_grad).wait();
      EXPECT_LT(difference(bias_grad, expected.ddown_b), kTight);
      EXPECT_GT(difference(down->bias.grad(), expected.ddown_b), 1e-3) << "a rank's own part is not the whole";
    });
    expect_no_errors(errors);
  }
}

// A vocabulary of 11 over 2 or 3 ranks: the embedding looks up the whole
// rows, the head multiplies by the same parts (GPT-2's tie), and the
// cross-entropy over the parts of the logits, with and without label
// smoothing, is PyTorch's over the whole logits, its gradient too.
TEST(TensorParallelTest, VocabularyParallelEmbeddingAndCrossEntropyAreTheWhole) {
  torch::manual_seed(5);
  auto o = torch::TensorOptions().dtype(torch::kFloat64);
  const auto table = torch::randn({11, 4}, o), shift = torch::randn({4}, o);
  const auto tokens = torch::randint(0, 11, {3, 5}, torch::kInt64);
  const auto targets = torch::randint(0, 11, {3, 5}, torch::kInt64);
  for (double smoothing : {0.0, 0.1}) {
    auto w = table.clone().requires_grad_(true);
    auto h = torch::embedding(w, tokens) + shift;
    auto loss = torch::nn::functional::cross_entropy(
        torch::linear(h, w).reshape({-1, 11}), targets.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone).label_smoothing(smoothing));
    loss.sum().backward();
    const auto expected_loss = loss.detach().reshape({3, 5});
    const auto expected_grad = w.grad().clone();
    for (int64_t world : {2, 3}) {
      auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
        VocabParallelEmbedding embedding(table, group);
        auto hidden = embedding(tokens) + shift;
        auto logits = torch::linear(copy_to(hidden, *group), embedding->weight);  // this rank's columns
        auto losses = vocab_parallel_cross_entropy(logits, targets, embedding->vocabulary(), 11, *group, smoothing);
        losses.sum().backward();
        const auto& part = embedding->vocabulary();
        EXPECT_LT(difference(losses, expected_loss), kTight) << "smoothing " << smoothing;
        EXPECT_LT(difference(embedding->weight.grad(), expected_grad.narrow(0, part.begin, part.size())), kTight)
            << "smoothing " << smoothing;
      });
      expect_no_errors(errors);
    }
  }
}

TEST(TensorParallelTest, PartsAreTorchChunksCut) {
  EXPECT_EQ(part_of(10, 0, 3).size(), 4);
  EXPECT_EQ(part_of(10, 2, 3).begin, 8);
  EXPECT_EQ(part_of(10, 2, 3).size(), 2);
  EXPECT_EQ(part_of(2, 2, 3).size(), 0);
  EXPECT_NE(testing::error_of([] { part_of(4, 3, 3); }).find("no part 3 of 3"), std::string::npos);
}

}  // namespace
}  // namespace tandem::parallel::tp
