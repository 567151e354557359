// tandem/models/split_region.h: where a layer of GPT-2 or LLaMA lets a
// parallelism split its matrices over ranks (parallel/tensor_parallel_plan.h).
//
// Note [split regions]: a model is written for one process; tensor
// parallelism cuts its parameters in place (each keeps its name, holding
// this rank's rows or columns) and needs three things of the layers, which
// they ask of these hooks, identities until a plan sets them:
//  - a region's input passes through `enter` (Megatron's copy-to: its
//    backward sums the input's gradient over the ranks);
//  - a region's last projection yields a partial sum, which passes
//    through `leave` (the all-reduce) before its bias is added, once;
//  - attention infers its heads from the projections' widths, so that a
//    rank holding some of the heads runs just those.
// An embedding looks up the rows of the vocabulary it holds (zeros for a
// token of another rank's rows) and sums the lookups through `leave`.
// With sequence parallelism `leave` also keeps this rank's part of the
// sequence (a reduce-scatter), `enter` gathers the whole sequence back,
// and what is added per position (GPT-2's positions) is taken for the
// positions this rank holds (`positions`).
//
// Note [dropout under tp]: a dropout mask is drawn whole, as one process
// draws it (the same shape, from the same generator state), and each rank
// keeps the part of it its activations hold: the heads of the attention's
// probabilities it runs, the positions of the sequence it holds under
// sequence parallelism, all of it where the activations are replicated.
// The ranks of a tp group run the same draws in the same order, so their
// default generators stay equal: a replicated activation gets one mask on
// every rank (its copies stay equal), a split one gets distinct parts of
// one mask, and the run equals one process's to rounding, dropout and all
// (where Megatron's tracker gives each rank a stream of its own). The cost:
// each rank draws the whole mask, tp times the random numbers of its part.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/types.h>

namespace tandem::models {

using TensorMap = std::function<torch::Tensor(const torch::Tensor&)>;

// Dropout of `x` with probability `p` when `training`: `x` is part `rank`
// of `parts` (torch.chunk's) along `dim` of a tensor of `whole` there; the
// mask is drawn for the whole (contiguous, in one bernoulli_ from the
// default generator) and this part kept (Note [dropout under tp]). With
// parts 1 it is plain dropout, x * mask / (1 - p).
torch::Tensor dropout_part(const torch::Tensor& x, double p, bool training, int64_t dim = 0, int64_t whole = -1,
                           int64_t rank = 0, int64_t parts = 1);

struct SplitRegion {
  TensorMap enter, leave;
  // The tp rank and group size: the region holds part `rank` of `parts` of
  // its heads (attention); `sequence`: its output holds that part of the
  // sequence (sequence parallelism), else all of it.
  int64_t rank = 0, parts = 1;
  bool sequence = false;
  torch::Tensor in(const torch::Tensor& x) const { return enter ? enter(x) : x; }
  torch::Tensor out(const torch::Tensor& x) const { return leave ? leave(x) : x; }
  // Whether the last projection's partial sum needs `leave` before its bias.
  bool split() const { return static_cast<bool>(leave); }
  // Dropout of the attention's probabilities [B, heads held, T, T] of a
  // layer of `heads` heads, and of the region's output [B, T held, C] of
  // a sequence of `positions` (Note [dropout under tp]).
  torch::Tensor dropout_heads(const torch::Tensor& probs, double p, bool training, int64_t heads) const {
    return dropout_part(probs, p, training, 1, heads, rank, parts);
  }
  torch::Tensor dropout_out(const torch::Tensor& y, double p, bool training, int64_t positions) const {
    return sequence ? dropout_part(y, p, training, 1, positions, rank, parts) : dropout_part(y, p, training);
  }
};

struct SplitLookup {
  int64_t begin = 0;  // the first vocabulary row this rank's weight holds
  TensorMap leave;
  // Sequence parallelism: the lookup's output holds part `sequence_rank`
  // of `sequence_parts` equal parts of the sequence.
  int64_t sequence_rank = 0, sequence_parts = 1;
  bool split() const { return static_cast<bool>(leave); }
  // This rank's part of `all` [T, ...], one row per position of the sequence.
  torch::Tensor positions(const torch::Tensor& all) const;
  // The embedding of `tokens` [B, T] through `weight` (this rank's rows).
  torch::Tensor lookup(const torch::Tensor& weight, const torch::Tensor& tokens) const;
  // Dropout of the embedding [B, T held, C] of a sequence of `positions`.
  torch::Tensor dropout(const torch::Tensor& x, double p, bool training, int64_t positions) const {
    return dropout_part(x, p, training, 1, positions, sequence_rank, sequence_parts);
  }
};

// Note [context split]: context parallelism (parallel/context_parallel.h)
// gives each rank part of every sequence, tokens that are not consecutive
// (two chunks of it). A layer then asks two things of this hook, unset
// (one process) until a plan sets them: the positions of the tokens it
// holds (GPT-2's learned positions, LLaMA's rotary angles), and causal
// attention of its queries over the whole sequence's keys and values (the
// ring). `parts`: the ranks the sequence is cut over.
struct ContextSplit {
  std::function<torch::Tensor(int64_t held, const torch::Device& device)> positions;  // int64
  std::function<torch::Tensor(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v)> attend;
  int64_t parts = 1;
  bool split() const { return static_cast<bool>(attend); }
};

}  // namespace tandem::models
