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
#pragma once

#include <cstdint>
#include <functional>

#include <torch/types.h>

namespace tandem::models {

using TensorMap = std::function<torch::Tensor(const torch::Tensor&)>;

struct SplitRegion {
  TensorMap enter, leave;
  torch::Tensor in(const torch::Tensor& x) const { return enter ? enter(x) : x; }
  torch::Tensor out(const torch::Tensor& x) const { return leave ? leave(x) : x; }
  // Whether the last projection's partial sum needs `leave` before its bias.
  bool split() const { return static_cast<bool>(leave); }
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
};

}  // namespace tandem::models
