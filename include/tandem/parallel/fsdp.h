// tandem/parallel/fsdp.h: fully sharded data parallelism (ZeRO stage 3;
// PyTorch's FullyShardedDataParallel) for a models::Sequence.
//
//   FullyShardedDataParallel fsdp(model, group);
//   optim::Sgd optimizer(fsdp.parameters(), options);  // the shards: 1/W of each parameter's rows
//   for (...) {
//     optimizer.zero_grad();
//     loss = loss_fn(fsdp.forward(x));   // each unit gathered, run, freed
//     loss.backward();                   // each unit gathered again; gradients reduce-scattered
//     fsdp.after_backward();             // waits; the shards' gradients are averaged
//     optimizer.step();                  // steps this rank's shards only
//   }
//
// Note [fsdp layers]: FSDP runs the model as a list of layers: its
// top-level layers, with a nested Sequence (a ResNet stage) opened up into
// its own layers, recursively, so that units can be as small as a residual
// block (PyTorch's size-based policy recurses into submodules too). That is
// the model's own forward as long as no Sequence checkpoints segments (one
// that does is kept whole).
//
// Note [fully sharded parameters]: the layers are grouped into units
// (fsdp_plan.h). Each rank keeps of every parameter only its shard, its
// 1/W of the rows (dim 0, as PyTorch's FSDP2), which is what the optimizer
// steps (its momentum is a shard too). The model's own
// parameter tensors stay (the same objects and names, so autograd's graph
// and a checkpoint's keys find them), but at rest they hold no elements
// (shape [0]): outside forward, backward and a FullParams scope their
// values are not there to be read. In forward, unit by unit: all-gather the
// shards into the unit's full buffer (Note [fsdp shards]), make the
// parameters aliases of their places in it (their own shapes and strides,
// dim 0 outermost), run the unit's layers, then release
// the buffer's memory (reshard_after_forward; otherwise it stays until the
// unit's backward: ZeRO-2's trade of memory for a collective). Releasing
// frees the memory of the buffer's storage itself, which the views of the
// parameters that autograd saved (a Linear's weight.t()) share, so that
// memory really goes, and gathering again fills the same storage.
// An identity node on the unit's output gathers the unit again when
// backward reaches it, before any of the unit's own backward runs. When the
// last of the unit's parameters has its gradient, the gradients are
// reduce-scattered (averaged) into the shards' gradients, and the unit's
// parameters and gradients are released. So a rank
// holds 1/W of the parameters, gradients and optimizer state, plus the full
// parameters and gradients of one or two units at a time.
//
// Note [fsdp shards]: a rank's shards of a unit lie one after another in
// one block, each with room for the ceil(rows / W) rows of a full chunk
// (fsdp_plan.h); the shards the optimizer steps are tensors of their own
// over the block's memory. So a unit is one all-gather of the blocks,
// after which each parameter's chunks are copied out of the gathered
// blocks into its rows of the full buffer, and one reduce-scatter of
// blocks, into which the gradients' rows were copied first (PyTorch's FSDP2
// copies out and in alike). A shard is Shard(0) of its parameter: the
// optimizer, a norm and a checkpoint see the parameter's own rows.
//
// Note [fsdp gradients in place]: when backward reaches a unit (the hook
// that gathers it), a zeroed gradient buffer laid out as the full one is
// made and each parameter's .grad() becomes the alias of its place in it,
// so autograd adds the gradients straight into one buffer, whose rows are
// then copied into the reduce-scatter's blocks in one pass a parameter.
//
// Note [fsdp activation checkpointing]: with checkpoint_activations, every
// unit but the last (and but one without parameters fed the data, which
// has no backward) runs its layers under models::checkpoint_activations
// in training: no activations kept, only the unit's input, and the forward
// run again in backward (PyTorch's FSDP with apply_activation_checkpointing
// per unit). The hook on the unit's output gathers the unit before that
// recomputation, which then needs no collective of its own; the unit's
// BatchNorm statistics are put back after it. The unit runs on a copy of
// its input, both times: a first layer that works in place (resnet's ReLU
// when every layer is a unit) would otherwise change the input kept for
// the recomputation, or, in it, a leaf that requires grad. The copy lives
// while the unit runs, unless the unit returns it.
//
// Note [fsdp prefetch]: with prefetch, forward starts unit k + 1's
// all-gather before it runs unit k, and backward starts unit k - 1's before
// it runs unit k's backward, so communication overlaps computation (Gloo
// runs collectives on threads of its own) at the price of two units in
// memory. A unit's reduce-scatter is started as soon as its gradients are
// in and runs while backward computes the unit before it; it is waited for
// when that unit's own starts (or in after_backward()), so one reduction is
// in flight at a time and at most two units' gradient buffers exist at once,
// not the whole model's.
//
// Note [fsdp collective order]: ranks must issue collectives in the same
// order. The all-gathers of forward and backward and the reduce-scatters go
// through two groups of their own (duplicates of the given one), so they
// never interleave with each other or with the caller's collectives (the
// trainer's metrics, SyncBatchNorm); reduce-scatters are launched strictly
// from the last unit to the first, a complete unit waiting for the ones
// after it, so a parameter that gets no gradient on one rank cannot reorder
// them. A unit whose parameters got no gradient at all is reduced in
// after_backward() with zeros. A gradient that arrives after its unit was
// reduced (a second backward in one step) is an error.
//
// Note [fsdp tied weights]: a layer may read another's parameter (GPT-2's
// head multiplies by the token embedding: models::TiedWeightUser). The
// parameter stays one tensor, in the unit of the layer that owns it, and
// that unit is pinned: gathered at the start of forward and kept until its
// own reduce-scatter in after_backward() (in evaluation, until forward
// ends), so the reading unit finds its values in forward and backward
// alike. The two uses' gradients may reach the parameter's accumulator
// apart (the owner's unit recomputed under activation checkpointing runs a
// backward of its own, after the reader's gradient arrived), so the
// pinned unit is reduced only once backward is over, with both. This is
// PyTorch FSDP's placement of shared parameters in the unit that holds
// both users (the root); the price is one unit kept whole.
//
// Buffers (BatchNorm statistics) are not sharded; as DDP does, they are
// broadcast from rank 0 before the first forward in training of each step
// (after the last after_backward(); broadcast_buffers), so the chunks of
// gradient accumulation update each rank's own, as under DDP's no_sync.
// At construction every rank's parameter names and shapes are compared and
// parameters and buffers broadcast from rank 0, as DDP does. Every
// parameter must require a gradient, and a unit's parameters must share one
// device and dtype. Thread safety: one thread calls forward and
// after_backward; the hooks run in autograd's thread.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/process_group.h"
#include "tandem/models/sequence.h"
#include "tandem/parallel/fsdp_plan.h"

namespace torch::autograd {
struct Node;
}

namespace tandem::parallel {

struct FsdpOptions {
  int64_t min_unit_numel = int64_t(1) << 17;  // 131072 parameters (plan_units)
  bool reshard_after_forward = true;          // false: full parameters kept until backward (ZeRO-2)
  bool prefetch = true;                       // Note [fsdp prefetch]
  bool broadcast_buffers = true;              // before each step's first forward in training, from rank 0
  bool checkpoint_activations = false;        // Note [fsdp activation checkpointing]
  // A layer may read a tied weight that is not the model's (a pipeline
  // stage's head reading another stage's embedding): left whole and to the
  // caller, who keeps it equal to its owner (engine/tied_stages.h). Else
  // such a weight is refused.
  bool foreign_tied_weights = false;
};

class FullyShardedDataParallel {
 public:
  // Throws tandem::Error for a parameter without requires_grad, a unit of
  // mixed devices or dtypes, or ranks whose models differ.
  FullyShardedDataParallel(models::Sequence model, std::shared_ptr<dist::ProcessGroup> group,
                           FsdpOptions options = {});
  ~FullyShardedDataParallel();
  FullyShardedDataParallel(const FullyShardedDataParallel&) = delete;
  FullyShardedDataParallel& operator=(const FullyShardedDataParallel&) = delete;

  // This rank's shards, one per model parameter in model_parameters()'s
  // order (leaves that require gradients; a parameter's shape with this
  // rank's rows of it, possibly none): what the optimizer steps.
  const std::vector<torch::Tensor>& parameters() const { return shards_; }

  // The model's forward, unit by unit (a collective: every rank calls it).
  // In training with gradients enabled, also sets up the backward's gathers
  // and reductions.
  torch::Tensor forward(const torch::Tensor& x);
  // Note [fsdp under a pipeline]: a pipeline stage runs several
  // micro-batches' forwards and backwards a step, interleaved (1F1B),
  // through its modules directly rather than forward(). Then the caller
  // holds a FullParams scope over the step (every unit gathered once), the
  // micro-batches' gradients accumulate in the parameters' .grad() as in
  // one process, and this reduce-scatters each unit's sum into its shard's
  // gradient (averaged over the ranks), clears the parameters' gradients
  // and releases the units. Between steps a rank holds 1/W of the
  // parameters, gradients and momentum, as with forward(); within one, its
  // stage's whole parameters and gradients (as PyTorch's FSDP under a
  // pipeline, which keeps them gathered over the micro-batches). A
  // collective; not with forward() in the same step.
  void reduce_accumulated_gradients();
  // Waits for the reductions; launches those of units whose parameters got
  // no gradient. The shards' gradients are then the average over the ranks
  // (added to what they held: gradient accumulation over several backward
  // passes works without no_sync).
  void after_backward();

  // While alive, every unit is gathered: the model's parameters hold their
  // full values (for evaluation outside forward, checkpoints, export). On
  // destruction, with write_back, the parameters' values (changed, e.g., by
  // loading a checkpoint) become the shards' again; then the units are
  // released. A collective: every rank makes and ends it together.
  class FullParams {
   public:
    FullParams(FullyShardedDataParallel& fsdp, bool write_back);
    ~FullParams();
    FullParams(const FullParams&) = delete;
    FullParams& operator=(const FullParams&) = delete;

   private:
    FullyShardedDataParallel& fsdp_;
    bool write_back_;
  };
  FullParams full_params(bool write_back = false) { return FullParams(*this, write_back); }

  // Ends the sharding (a collective): every parameter gets its full value
  // in memory of its own, the hooks are removed, and the model trains and
  // evaluates as a plain one again; this object may then only be destroyed.
  // The shards keep their values (an optimizer still holding them steps
  // nothing the model sees).
  void detach_model();
  bool detached() const { return detached_; }

  // Tensors shaped like the shards (e.g. momentum buffers), one per entry of
  // parameters(), gathered into tensors shaped and strided like the model's
  // parameters, in model->parameters() order. A collective.
  std::vector<torch::Tensor> gather_like_parameters(const std::vector<torch::Tensor>& shard_like);
  // The inverse, local: tensors shaped like the model's parameters (in
  // model->parameters() order) cut into this rank's shards.
  std::vector<torch::Tensor> shard_like_parameters(const std::vector<torch::Tensor>& full) const;

  // Where this rank's shards lie in the model's parameters, without a
  // collective (a checkpoint written by each rank: checkpoint/sharded_checkpoint.h):
  // per entry of parameters(), none (no rows here) or one span, a run of
  // `numel` elements starting at `shard_offset` (0) in the shard's memory
  // order and at `offset` in the parameter's (its strides: the model's,
  // which may be channels-last; dim 0 outermost, so the rows are one run).
  struct ShardSpan {
    size_t parameter = 0;  // into model_parameters()
    int64_t offset = 0, numel = 0, shard_offset = 0;
    std::vector<int64_t> shape, strides;  // the parameter's (it holds no elements at rest)
  };
  std::vector<std::vector<ShardSpan>> shard_spans() const;

  // Units over layer_names(): Note [fsdp layers].
  const std::vector<FsdpUnitPlan>& units() const { return plans_; }
  const std::vector<std::string>& layer_names() const { return layer_names_; }
  // "conv1..layer1.1 | layer2.0 | ..." for logs.
  std::string describe_units() const;
  // The model's parameters, in model->parameters() order.
  const std::vector<torch::Tensor>& model_parameters() const { return parameters_; }
  // Their shapes (at rest they hold no elements), in the same order.
  std::vector<std::vector<int64_t>> parameter_shapes() const;
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  dist::ProcessGroup& group() { return *group_; }
  // Units whose full parameters are allocated now (at rest: none).
  int64_t gathered_units() const;

  // Called from autograd (the identity node on a unit's output; the
  // parameters' gradient hooks).
  void before_unit_backward(size_t unit);
  void gradient_ready(size_t parameter);

 private:
  struct Unit;
  void gather(size_t unit);          // launches the all-gather (allocating the buffer) if needed
  void wait_gathered(size_t unit);   // gather() and wait
  void release(size_t unit);         // frees the full buffer
  void launch_reductions(bool pinned_too = false);  // requires mutex_: complete units, last first
  void reduce(size_t unit);          // requires mutex_
  void settle_reductions();          // requires mutex_: waits, adds into the shards' gradients

  models::Sequence model_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::shared_ptr<dist::ProcessGroup> gather_group_, reduce_group_;  // Note [fsdp collective order]
  FsdpOptions options_;
  int64_t rank_ = 0, world_ = 1;
  std::vector<torch::nn::AnyModule> layers_;  // Note [fsdp layers]
  std::vector<std::string> layer_names_;
  std::vector<std::vector<torch::Tensor>> unit_buffers_;  // per unit: its layers' buffers
  std::vector<FsdpUnitPlan> plans_;
  std::vector<std::unique_ptr<Unit>> units_;
  std::vector<torch::Tensor> shards_;
  std::vector<size_t> unit_of_;    // per parameter (model order)
  std::vector<torch::Tensor> parameters_;  // the model's, in order
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  bool detached_ = false;
  std::mutex mutex_;                  // the backward state below
  bool in_backward_ = false;          // set by forward() in training, cleared by after_backward()
  std::vector<int64_t> missing_;      // per unit: gradients still to come
  std::vector<bool> seen_;            // per parameter
  size_t reduced_down_to_ = 0;        // units [reduced_down_to_, n) are launched
  int64_t full_params_depth_ = 0;
};

}  // namespace tandem::parallel
