// tandem/models/moe.h: a mixture-of-experts feed-forward layer as Hugging
// Face transformers' Mixtral and Qwen3-MoE compute it: a linear router
// scores every expert for every token, each token goes to its top k
// experts (softmax, then top k, then, where the family says so, the k
// weights renormalised to sum to one), each expert is a SwiGLU MLP, and the
// token's output is the weighted sum of its experts' outputs.
//
//   models::SparseMoe moe(models::MoeConfig{/*hidden=*/128, /*intermediate=*/64, /*experts=*/8, /*top_k=*/2});
//   auto y = moe->forward(x);  // [B, T, hidden] -> [B, T, hidden]
//
// Note [dropless grouped experts]: no token is dropped and no expert has a
// capacity. The (token, expert) pairs are sorted by expert (stably, so each
// expert's tokens keep their order), and each expert runs one matrix
// product per projection over all of its tokens: a loop over experts, never
// over tokens. An expert no token chose runs on zero rows, so that every
// parameter has a gradient (zeros) every step and the data-parallel
// reductions see the same tensors on every rank. The experts' weights are
// three 3-D tensors [experts, out, in], one slice per expert: expert
// parallelism cuts them on dim 0, tensor parallelism on the feature dim.
//
// Note [routing in float64]: transformers computes the router's softmax in
// float32 whatever the model's dtype; tandem computes it in the wider of
// float32 and the model's dtype, so a float64 model routes in float64 (a
// float32 or bfloat16 model routes exactly as transformers does). The
// float64 comparisons change transformers the same way
// (tests/testing/transformers_peer.py).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/nn.h>

#include "tandem/models/split_region.h"

namespace tandem::models {

struct MoeConfig {
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;  // each expert's
  int64_t num_experts = 0;
  int64_t experts_per_token = 2;  // k
  bool normalize_top_k = true;    // Mixtral always; Qwen3-MoE's norm_topk_prob
  void check() const;
};

// What a router decided over the training forwards since it was last
// asked: per expert, the (token, expert) pairs it got and the sum of its
// softmax probabilities over the tokens; `rows` the tokens. Detached (for
// logs and the balancing loss's value), in float64, on the CPU.
struct RouterRecord {
  torch::Tensor tokens_per_expert, probability_sum;  // [experts]
  int64_t rows = 0;
};

// Note [expert split]: expert parallelism (parallel/expert_parallel.h)
// gives each rank some of the experts and sends each (token, expert) pair
// to the rank holding its expert and the result back. `dispatch` gets the
// rows grouped by expert with their counts per expert (all experts) and
// the computation of the experts this rank holds (rows grouped by held
// expert, their counts); it returns the results in the rows' order. Unset
// (one process): the computation runs on the rows as they are.
struct ExpertSplit {
  using Compute = std::function<torch::Tensor(const torch::Tensor& grouped, const std::vector<int64_t>& counts)>;
  std::function<torch::Tensor(const torch::Tensor& grouped, const std::vector<int64_t>& counts,
                              const Compute& compute)>
      dispatch;
  bool split() const { return static_cast<bool>(dispatch); }
};

// transformers' MixtralTopKRouter / Qwen3MoeTopKRouter: weight [experts, hidden].
class TopKRouterImpl : public torch::nn::Cloneable<TopKRouterImpl> {
 public:
  explicit TopKRouterImpl(MoeConfig config);
  void reset() override;
  struct Routing {
    torch::Tensor probabilities;  // [rows, experts], Note [routing in float64]
    torch::Tensor weights;        // [rows, k], in the input's dtype
    torch::Tensor experts;        // [rows, k] int64
  };
  Routing route(const torch::Tensor& rows);  // rows [N, hidden]
  torch::Tensor weight;

 private:
  MoeConfig config_;
};
TORCH_MODULE(TopKRouter);

// The experts' SwiGLU MLPs as three 3-D weights: gate_proj and up_proj
// [experts, intermediate, hidden], down_proj [experts, hidden, intermediate]
// (Note [dropless grouped experts]).
class GroupedExpertsImpl : public torch::nn::Cloneable<GroupedExpertsImpl> {
 public:
  explicit GroupedExpertsImpl(MoeConfig config);
  void reset() override;
  // `grouped` [N, hidden]: rows of expert 0 of those held, then expert 1's,
  // ...; counts[e] rows each (as many counts as experts held).
  torch::Tensor forward(const torch::Tensor& grouped, const std::vector<int64_t>& counts);
  torch::Tensor gate_proj, up_proj, down_proj;

 private:
  MoeConfig config_;
};
TORCH_MODULE(GroupedExperts);

class SparseMoeImpl : public torch::nn::Cloneable<SparseMoeImpl> {
 public:
  explicit SparseMoeImpl(MoeConfig config);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);  // [B, T, hidden]
  const MoeConfig& config() const { return config_; }
  // The routing of the training forwards since the last call (summed),
  // and a fresh start; empty when none ran (evaluation, and a forward
  // without an autograd graph, do not count).
  RouterRecord take_routing();
  TopKRouter gate{nullptr};
  GroupedExperts experts{nullptr};
  SplitRegion split;    // tensor parallelism: the experts by features (Note [split regions])
  ExpertSplit spread;   // expert parallelism (Note [expert split])

 private:
  void record(const torch::Tensor& counts, const torch::Tensor& probabilities, int64_t rows);
  MoeConfig config_;
  RouterRecord routed_;
};
TORCH_MODULE(SparseMoe);

// transformers' load_balancing_loss_func over `records` (one per MoE layer,
// the same tokens): num_experts * sum_e f_e * P_e, where f_e is expert e's
// (token, expert) pairs per token and P_e its mean router probability, both
// over all the layers' rows together. 0 when there is no record.
double load_balancing_loss(const std::vector<RouterRecord>& records, int64_t num_experts);

// take_routing() of every SparseMoe in `module`, in module order (those
// that ran a training forward).
std::vector<RouterRecord> take_router_records(torch::nn::Module& module);

}  // namespace tandem::models
