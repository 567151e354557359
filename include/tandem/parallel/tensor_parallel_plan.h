// tandem/parallel/tensor_parallel_plan.h: tensor parallelism applied to a
// whole GPT-2 or LLaMA model (torchtitan's parallelize plans, Megatron-LM's
// layers), in place.
//
//   torch::manual_seed(seed);
//   auto model = models::gpt2(config);              // whole, as in one process
//   TensorParallelPlan plan(model, mesh.group(dist::MeshDim::kTensor));
//   auto logits = model->forward(tokens);          // [B, T, this rank's vocabulary part]
//   auto loss = tp::vocab_parallel_cross_entropy(logits, targets, plan.vocabulary(),
//                                               plan.vocab_size(), plan.group()).mean();
//
// Note [tensor-parallel plans]: per family, which parameter is cut how
// (Megatron-LM's layout):
//   attention   query/key/value projections by heads (column: output
//               rows; GPT-2's fused c_attn takes its q, k and v parts of
//               this rank's heads), output projection by the same heads
//               (row: input columns, its bias whole)
//   MLP         up (and LLaMA's gate) by hidden features (column), down
//               by the same features (row)
//   embedding   by vocabulary rows; the head's logits (GPT-2's tied
//               weight, LLaMA's lm_head) by the same rows, so the whole
//               logits are never formed (the loss: vocab_parallel_cross_entropy)
//   the rest    whole on every rank (norms, GPT-2's positions)
// Each parameter keeps its name and tensor, holding this rank's part
// (set_data), so optimizers, checkpoint names and the tie stay as they
// are; the layers' split regions (models/split_region.h) get the
// collectives. Heads (and LLaMA's key/value heads) must be divisible by
// tp; features and vocabulary are cut as torch.chunk cuts. Every rank of
// the group builds the same whole model first (the same seed, or the same
// loaded weights), so what trains does not depend on tp.
//
// Without sequence parallelism every rank computes the whole parameters'
// gradients alike, so nothing is reduced over tp for them; the parts'
// gradients are each rank's own.
//
// Note [sequence-parallel plans]: with `sequence_parallel`, what lies
// between the regions (the residual stream, the norms, the row layers'
// biases, GPT-2's positions) holds 1/tp of the sequence: the embedding's
// lookup is reduce-scattered along it, each region's input all-gathered
// and its output reduce-scattered, the head's input all-gathered
// (Note [sequence parallel], tensor_parallel.h). A whole parameter then
// sees only this rank's positions, so its gradient is a partial sum:
// reduce_gradients() sums the whole parameters' gradients over the tp
// group (one all-reduce of them all, Megatron-LM's all-reduce of its
// sequence-parallel gradients) after backward and before clipping or a
// step. The sequence length must be a multiple of tp. Dropout is refused
// under tensor parallelism (GPT-2's config.dropout): each rank's
// generator would draw the same mask for its own heads and positions.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "tandem/dist/placement.h"
#include "tandem/dist/process_group.h"
#include "tandem/models/sequence.h"
#include "tandem/models/split_region.h"
#include "tandem/parallel/tensor_parallel.h"

namespace tandem::parallel {

// Throws tandem::Error unless `world` tp ranks divide the model's `size`
// heads (`what`: "heads", "key/value heads"): the plan's refusal, which
// the CLI also makes from the model's traits before any worker starts.
void check_divides_heads(int64_t size, const std::string& what, int64_t world);

struct TensorParallelPlanOptions {
  bool sequence_parallel = false;  // Note [sequence-parallel plans]
};

class TensorParallelPlan {
 public:
  // Cuts `model` in place over `group` (Note [tensor-parallel plans]).
  // Throws tandem::Error naming a model with no plan (no GPT-2 or LLaMA
  // layers), heads that the group's size does not divide, and dropout.
  TensorParallelPlan(models::Sequence model, std::shared_ptr<dist::ProcessGroup> group,
                     TensorParallelPlanOptions options = {});

  const tp::Part& vocabulary() const { return vocabulary_; }
  int64_t vocab_size() const { return vocab_size_; }
  dist::ProcessGroup& group() const { return *group_; }
  int64_t size() const { return group_->size(); }

  // A parameter's placement over tp (dist/placement.h): Shard(dim) with
  // the rows each rank holds for a cut one, Replicate for one that is
  // whole on every rank (and one it does not know).
  const dist::Placement& cut(const torch::Tensor& parameter) const;
  // This rank's part of `whole`, a tensor shaped like `parameter`'s whole
  // (its value, a gradient or optimizer state); no collective.
  torch::Tensor part_of_whole(const torch::Tensor& parameter, const torch::Tensor& whole) const;
  // The whole of `part`, this rank's part of `parameter` (a collective:
  // every rank of the group calls it for the same parameter).
  torch::Tensor whole_of_part(const torch::Tensor& parameter, const torch::Tensor& part) const;

  bool sequence_parallel() const { return options_.sequence_parallel && !detached_; }
  // A parameter's gradient's placement over tp after backward: a whole
  // parameter's is Partial under sequence parallelism (each rank saw its
  // part of the sequence) and where the plan says so whatever the options
  // (a weight that each rank applies to its part of the features: Qwen3's
  // per-head q/k norms, a mixture of experts' router), otherwise the
  // parameter's own (cut()).
  dist::Placement gradient_placement(const torch::Tensor& parameter) const;
  // Whether any gradient is Partial (so reduce_gradients() sums some).
  bool partial_gradients() const { return sequence_parallel() || (!partial_.empty() && !detached_); }
  // With sequence parallelism, the whole parameters' gradients summed over
  // the group (a collective, after backward; Note [sequence-parallel
  // plans]); nothing without it.
  void reduce_gradients();

  // Note [tensor-parallel checkpoints]: a checkpoint holds the whole
  // model and the plain optimizer's state over it, whatever tp wrote it, so
  // that any tp resumes it. make_whole() gives every cut parameter, and
  // each of its optimizer state tensors shaped like it (SGD's momentum,
  // AdamW's moments), its whole value (a collective: every rank of the
  // group, the same parameters in the same order); a checkpoint is then
  // written or read as by one process; cut_again() keeps this rank's part
  // of the whole values, written or read (no collective), into the very
  // tensors that held the parts (FSDP's parameters are views of its flat
  // buffer, which must stay so). The model must not run in between.
  void make_whole(torch::optim::Optimizer* optimizer);
  void cut_again(torch::optim::Optimizer* optimizer);

  // Ends the cut (a collective): every cut parameter gets its whole value
  // (whole_of_part) and the layers' split hooks are cleared, so the model
  // is the plain whole model again (for an export, or evaluation after
  // training). The plan then only answers detached().
  void detach();
  bool detached() const { return detached_; }

  // "12 parameters cut (attention by 2 of 4 heads, ...)", for the log.
  std::string describe() const { return description_; }

 private:
  void cut_parameter(torch::Tensor& p, int64_t dim, std::vector<torch::Tensor> indices);

  models::Sequence model_;
  std::shared_ptr<dist::ProcessGroup> group_;
  TensorParallelPlanOptions options_;
  tp::Part vocabulary_;
  int64_t vocab_size_ = 0;
  std::unordered_map<const c10::TensorImpl*, dist::Placement> cuts_;
  std::unordered_set<const c10::TensorImpl*> partial_;  // whole, their gradients Partial anyway
  dist::Placement whole_;  // what cut() returns for the others
  std::string description_;
  std::vector<models::SplitRegion*> regions_;  // the hooks set, cleared by detach()
  std::vector<models::SplitLookup*> lookups_;
  std::vector<torch::Tensor> held_parts_;  // make_whole()'s, for cut_again()
  bool detached_ = false;
};

}  // namespace tandem::parallel
