// Tensor parallelism applied to whole GPT-2 and LLaMA models
// (parallel/tensor_parallel_plan.h) on thread ranks over Gloo, in float64,
// against the same model in one process: the loss, every parameter's
// gradient (its part of the whole gradient) and the weights after AdamW
// steps. Vocabularies and MLP widths that tp does not divide, LLaMA's
// grouped-query heads and its tied form are among them.
#include <gtest/gtest.h>

#include <functional>

#include <torch/torch.h>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/models/registry.h"
#include "tandem/optim/adamw.h"
#include "tandem/parallel/tensor_parallel_plan.h"
#include "testing.h"

namespace tandem::parallel {
namespace tensor_parallel_plan_test {  // the file's own names (a layer's tests compile as one unit)

using testing::expect_no_errors;
using testing::run_ranks;

constexpr int kSteps = 3;

struct Batch {
  torch::Tensor tokens, targets;
};
// Drawn before any rank's thread starts: the generator is the process's.
std::vector<Batch> batches(int64_t vocab, int64_t seq = 8) {
  torch::manual_seed(100);
  std::vector<Batch> all;
  for (int s = 0; s < kSteps; ++s) {
    all.push_back(
        {torch::randint(0, vocab, {3, seq}, torch::kInt64), torch::randint(0, vocab, {3, seq}, torch::kInt64)});
  }
  return all;
}

torch::optim::AdamWOptions adamw() { return torch::optim::AdamWOptions(1e-2).betas({0.9, 0.95}).weight_decay(0.1); }

// The one-process run: the first step's loss and gradients (by name), the
// weights after kSteps.
struct Reference {
  double first_loss = 0;
  std::map<std::string, torch::Tensor> first_grads, final_weights;
};
Reference reference(const std::function<models::Sequence()>& make, int64_t vocab, int64_t seq) {
  auto model = make();
  optim::AdamW optimizer(optim::decay_groups(model->named_parameters(), adamw()), adamw());
  Reference r;
  const auto data = batches(vocab, seq);
  for (int s = 0; s < kSteps; ++s) {
    const auto& b = data[s];
    optimizer.zero_grad();
    auto loss = torch::nn::functional::cross_entropy(model->forward(b.tokens).reshape({-1, vocab}),
                                                     b.targets.reshape({-1}));
    loss.backward();
    if (s == 0) {
      r.first_loss = loss.item<double>();
      for (const auto& p : model->named_parameters()) r.first_grads[p.key()] = p.value().grad().clone();
    }
    optimizer.step();
  }
  for (const auto& p : model->named_parameters()) r.final_weights[p.key()] = p.value().detach().clone();
  return r;
}

// The same on `world` thread ranks, each cutting its own whole copy;
// with sequence parallelism, sequences of `seq` tokens.
void expect_tensor_parallel_is_one_process(const std::function<models::Sequence()>& make, int64_t vocab,
                                           int64_t world, TensorParallelPlanOptions options = {},
                                           int64_t seq = 8) {
  const auto expected = reference(make, vocab, seq);
  const auto data = batches(vocab, seq);
  std::vector<models::Sequence> copies;
  for (int64_t r = 0; r < world; ++r) copies.push_back(make());  // the generator is the process's: here, in turn
  auto errors = run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto model = copies[group->rank()];
    const auto whole_numel = models::count_parameters(*model);
    TensorParallelPlan plan(model, group, options);
    EXPECT_LT(models::count_parameters(*model), whole_numel) << "each rank holds parts";
    optim::AdamW optimizer(optim::decay_groups(model->named_parameters(), adamw()), adamw());
    for (int s = 0; s < kSteps; ++s) {
      const auto& b = data[s];
      optimizer.zero_grad();
      auto logits = model->forward(b.tokens);
      EXPECT_EQ(logits.size(-1), plan.vocabulary().size());
      auto loss = tp::vocab_parallel_cross_entropy(logits, b.targets, plan.vocabulary(), plan.vocab_size(),
                                                   plan.group())
                      .mean();
      loss.backward();
      plan.reduce_gradients();
      if (s == 0) {
        EXPECT_NEAR(loss.item<double>(), expected.first_loss, 1e-13);
        for (const auto& p : model->named_parameters()) {
          const auto part = plan.part_of_whole(p.value(), expected.first_grads.at(p.key()));
          EXPECT_LT((p.value().grad() - part).abs().max().item<double>(), 1e-13)
              << p.key() << " on rank " << group->rank();
        }
      }
      optimizer.step();
    }
    for (const auto& p : model->named_parameters()) {
      auto whole = plan.whole_of_part(p.value(), p.value().detach());
      const auto& want = expected.final_weights.at(p.key());
      EXPECT_LT((whole - want).abs().max().item<double>() / want.abs().max().item<double>(), 1e-10)
          << p.key() << " on rank " << group->rank();
    }
  });
  expect_no_errors(errors);
}

models::Gpt2Config gpt2_config(int64_t heads) {
  models::Gpt2Config c;
  c.vocab_size = 37;  // cut 19/18 or 13/13/11
  c.n_positions = 16;
  c.n_embd = 4 * heads;
  c.n_layer = 2;
  c.n_head = heads;
  return c;
}

// The same whole GPT-2 (seed 7, float64) on every call.
std::function<models::Sequence()> gpt2_maker(const models::Gpt2Config& config) {
  return [config] {
    torch::manual_seed(7);
    auto m = models::gpt2(config);
    m->to(torch::kFloat64);
    return m;
  };
}

// A small LLaMA with grouped-query heads and an MLP width (42) that tp=2
// cuts 21/21, built the same (seed 9, float64) on every call.
std::function<models::Sequence()> llama_maker(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 37;
  c.hidden_size = 16;
  c.intermediate_size = 42;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 16;
  c.tie_embeddings = tied;
  return [c] {
    torch::manual_seed(9);
    auto m = models::llama(c);
    m->to(torch::kFloat64);
    return m;
  };
}

TEST(TensorParallelPlanTest, Gpt2OnTwoAndThreeRanksIsOneProcess) {
  for (int64_t world : {2, 3}) {
    const auto config = gpt2_config(world == 2 ? 4 : 6);
    const auto make = gpt2_maker(config);
    SCOPED_TRACE("tp=" + std::to_string(world));
    expect_tensor_parallel_is_one_process(make, config.vocab_size, world);
  }
}

// Note [sequence-parallel plans]: the norms, positions and row biases on
// 1/tp of the sequence (9 tokens over 3 ranks), their gradients summed.
// Control: without reduce_gradients() the whole parameters' gradients are
// each rank's part of them, and the test above's comparison fails.
TEST(TensorParallelPlanTest, SequenceParallelIsOneProcess) {
  for (int64_t world : {2, 3}) {
    const auto config = gpt2_config(world == 2 ? 4 : 6);
    const auto make = gpt2_maker(config);
    SCOPED_TRACE("gpt2, sequence parallel, tp=" + std::to_string(world));
    expect_tensor_parallel_is_one_process(make, config.vocab_size, world, {true}, world == 2 ? 8 : 9);
  }
  SCOPED_TRACE("llama, sequence parallel, tp=2");
  expect_tensor_parallel_is_one_process(llama_maker(false), 37, 2, {true});
}

TEST(TensorParallelPlanTest, SequenceParallelWithoutTheGradientSumIsNot) {
  const auto config = gpt2_config(4);
  const auto make = gpt2_maker(config);
  const auto expected = reference(make, config.vocab_size, 8);
  const auto data = batches(config.vocab_size);
  std::vector<models::Sequence> copies{make(), make()};
  std::vector<double> worst(2);
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto model = copies[group->rank()];
    TensorParallelPlan plan(model, group, {true});
    auto loss = tp::vocab_parallel_cross_entropy(model->forward(data[0].tokens), data[0].targets, plan.vocabulary(),
                                                 plan.vocab_size(), plan.group())
                    .mean();
    loss.backward();  // no reduce_gradients()
    for (const auto& p : model->named_parameters()) {
      const auto part = plan.part_of_whole(p.value(), expected.first_grads.at(p.key()));
      worst[group->rank()] = std::max(worst[group->rank()], (p.value().grad() - part).abs().max().item<double>());
    }
  });
  expect_no_errors(errors);
  EXPECT_GT(std::min(worst[0], worst[1]), 1e-6);
}

TEST(TensorParallelPlanTest, LlamaWithGroupedQueryHeadsIsOneProcess) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    expect_tensor_parallel_is_one_process(llama_maker(tied), 37, 2);
  }
}

// Memory and traffic, measured: each rank's cut parameters hold their
// part of the whole ones' bytes (the storages' sizes, summed over the
// ranks: the whole; each about 1/tp), and one step's all-reduces over the
// tp group carry Megatron-LM's figure (as counted by the group, Note
// [traffic]): per block two in forward (attention's and the MLP's partial
// sums) and two in backward (their inputs' gradients), one for the
// embedding's lookup and one for the head's input gradient, each of B x T
// x width elements; and the vocabulary-parallel loss's two of per-row
// numbers (the max, then three sums).
TEST(TensorParallelPlanTest, MemoryAndTrafficAreMegatronsFigures) {
  const auto config = gpt2_config(4);  // width 16, 2 blocks
  const auto make = gpt2_maker(config);
  const auto data = batches(config.vocab_size);
  int64_t whole_bytes = 0;
  std::vector<models::Sequence> copies{make(), make()};
  {
    auto whole = make();
    for (const auto& p : whole->parameters()) whole_bytes += p.nbytes();
  }
  std::vector<int64_t> cut_bytes(2), kept_bytes(2);
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto model = copies[group->rank()];
    TensorParallelPlan plan(model, group);
    for (const auto& p : model->parameters()) {
      const auto bytes = static_cast<int64_t>(p.storage().nbytes());
      (plan.cut(p).is_shard() ? cut_bytes : kept_bytes)[group->rank()] += bytes;
    }
    group->reset_traffic();
    auto loss = tp::vocab_parallel_cross_entropy(model->forward(data[0].tokens), data[0].targets, plan.vocabulary(),
                                                 plan.vocab_size(), plan.group())
                    .mean();
    loss.backward();
    const auto traffic = group->traffic();
    const int64_t rows = 3 * 8, activations = rows * config.n_embd;
    const int64_t expected_elements = (4 * config.n_layer + 2) * activations + rows + 3 * rows;
    EXPECT_EQ(traffic.at("all_reduce").bytes, expected_elements * 8);
    EXPECT_EQ(traffic.at("all_reduce").calls, 4 * config.n_layer + 2 + 2);
  });
  expect_no_errors(errors);
  EXPECT_EQ(kept_bytes[0], kept_bytes[1]);  // the whole parameters, on each rank
  EXPECT_EQ(cut_bytes[0] + cut_bytes[1] + kept_bytes[0], whole_bytes);
  for (int r = 0; r < 2; ++r) {
    const double share = static_cast<double>(cut_bytes[r]) / static_cast<double>(cut_bytes[0] + cut_bytes[1]);
    EXPECT_NEAR(share, 0.5, 0.02) << "rank " << r;  // the vocabulary of 37: 19 and 18 rows
  }
}

// With sequence parallelism each of those all-reduces of B x T x width
// becomes an all-gather and a reduce-scatter (Note [sequence parallel]):
// per block two of each in forward and two in backward, one of each for
// the embedding and the head. The group counts an all-gather's input (1/tp
// of the activations) and a reduce-scatter's inputs (all of them); on the
// wire each moves (tp - 1)/tp of the activations, so the pair moves what
// one all-reduce does. The all-reduces left: the loss's, and one of the
// whole parameters' gradients (reduce_gradients()).
TEST(TensorParallelPlanTest, SequenceParallelTrafficIsMegatronsFigure) {
  const auto config = gpt2_config(4);
  const auto data = batches(config.vocab_size);
  const auto make = gpt2_maker(config);
  std::vector<models::Sequence> copies{make(), make()};
  auto errors = run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto model = copies[group->rank()];
    TensorParallelPlan plan(model, group, {true});
    int64_t whole_elements = 0;
    for (const auto& p : model->parameters()) whole_elements += plan.cut(p).is_shard() ? 0 : p.numel();
    group->reset_traffic();
    auto loss = tp::vocab_parallel_cross_entropy(model->forward(data[0].tokens), data[0].targets, plan.vocabulary(),
                                                 plan.vocab_size(), plan.group())
                    .mean();
    loss.backward();
    plan.reduce_gradients();
    const auto traffic = group->traffic();
    const int64_t rows = 3 * 8, activations = rows * config.n_embd, regions = 4 * config.n_layer + 2;
    EXPECT_EQ(traffic.at("all_gather").calls, regions);
    EXPECT_EQ(traffic.at("all_gather").bytes, regions * activations / 2 * 8);
    EXPECT_EQ(traffic.at("reduce_scatter").calls, regions);
    EXPECT_EQ(traffic.at("reduce_scatter").bytes, regions * activations * 8);
    EXPECT_EQ(traffic.at("all_reduce").calls, 2 + 1);
    EXPECT_EQ(traffic.at("all_reduce").bytes, (rows + 3 * rows + whole_elements) * 8);
  });
  expect_no_errors(errors);
}

TEST(TensorParallelPlanTest, WhatCannotBeCutIsNamed) {
  auto errors = run_ranks(3, [](std::shared_ptr<dist::ProcessGroup> group) {
    torch::manual_seed(1);
    auto gpt2 = models::gpt2(gpt2_config(4));
    EXPECT_NE(testing::error_of([&] { TensorParallelPlan(gpt2, group); }).find("3 ranks do not divide the model's 4 heads"),
              std::string::npos);
    models::Sequence plain;
    plain->push_back("fc", torch::nn::Linear(4, 4));
    EXPECT_NE(testing::error_of([&] { TensorParallelPlan(plain, group); }).find("has no tensor-parallel plan"),
              std::string::npos);
  });
  expect_no_errors(errors);
}

}  // namespace tensor_parallel_plan_test
}  // namespace tandem::parallel
