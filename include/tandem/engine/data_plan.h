// tandem/engine/data_plan.h: how a run does its data-parallel dimension,
// one part per parallelism behind one small interface.
//
//   one process      the model as it is (also --strategy fsdp alone)
//   allreduce        seed 004's average_gradients after backward
//   ddp              parallel::DistributedDataParallel: buckets all-reduced in backward
//   fsdp             parallel::FullyShardedDataParallel: parameters sharded, gathered per unit
//   dp               parallel::DataParallel: one process, the batch scattered over --devices
//
// Note [data plans]: the Trainer runs a step as phases (begin, forward and
// backward per chunk or micro-batch, reduce, clip, optimizer step) and asks
// the plan at each phase; it never asks which plan it holds. What a plan
// replicates is `replica` (the model, or under a mesh this rank's pipeline
// pieces, Note [replicated stages]), so the same parts compose with the
// pipeline dimension: the pipeline runs the micro-batches between
// begin_micro_batches() and end_micro_batches(), and the plan reduces once
// after them. A plan's parameters() are what this rank steps and checks:
// the model's, or FSDP's shards; placed_parameters() says where each piece
// lies, from which the gradient norm and the divergence check's names
// follow.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tandem/dist/placement.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/train_options.h"
#include "tandem/models/sequence.h"
#include "tandem/optim/sgd.h"
#include "tandem/optim/make_optimizer.h"

namespace tandem::parallel {
class FullyShardedDataParallel;
}

namespace tandem::engine {

// Something held for a scope (a gathered model, a pause of the reduction):
// letting go of it ends what it began.
using Held = std::shared_ptr<void>;

class DataPlan {
 public:
  virtual ~DataPlan() = default;

  // What the run's account calls it: "ddp", "fsdp", "allreduce", "dp" or
  // "one process".
  virtual std::string name() const = 0;
  // The account's lines about it, before the first step (none by default).
  virtual std::vector<std::string> describe() const { return {}; }

  // A step begins: the gradients cleared (the optimizer's or the plan's
  // own buffers) and the BatchNorm statistics made those of dp rank 0.
  virtual void begin_step(torch::optim::Optimizer& optimizer) = 0;
  // Forward of (a chunk of) the batch through the whole model, in training.
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
  // Forward in evaluation: the model's own, unless the plan holds its weights.
  virtual torch::Tensor evaluation_forward(const torch::Tensor& x);
  // Held over the backwards of all --grad-accum chunks but the last: their
  // gradients only accumulate (null: nothing to hold).
  virtual Held accumulate_only() { return nullptr; }
  // A pipeline's micro-batches run between these two, and the plan reduces
  // their summed gradients after (Note [replicated stages]); in between,
  // the pipeline says when this rank's chunk (its k-th piece) starts its
  // last backward, after which its gradients are final.
  virtual Held begin_micro_batches() { return accumulate_only(); }
  virtual void before_last_backward(int64_t /*chunk*/) {}
  virtual void end_micro_batches() {}
  // After the step's backward(s): the gradients averaged over the dp ranks.
  virtual void after_backward() = 0;

  // What this rank steps: the model's parameters, or its shards of them.
  virtual std::vector<torch::Tensor> parameters() const = 0;
  // The same, each with the model's name for it and its placement over
  // the dp ranks (Note [placements]): Replicate for the model's own
  // parameters, Shard(0) for FSDP's shards of them. The other
  // dimensions' parts add theirs (tp's cut, a pipeline's copies).
  virtual std::vector<dist::PlacedTensor> placed_parameters() const;
  // Whether parameters() are this rank's shards, disjoint from the other
  // dp ranks' (a gradient norm is then summed over them).
  virtual bool sharded() const { return false; }
  // The optimizer the plan steps with (FSDP's over its shards), or null
  // for optim::make_optimizer's over the model's parameters (plain, or
  // ZeRO-1).
  virtual std::unique_ptr<torch::optim::Optimizer> make_optimizer(const optim::OptimizerSettings&) { return nullptr; }
  // The whole model's weights on this rank while held (FSDP gathers them;
  // `write_back`: what is loaded into them is kept as the shards).
  virtual Held whole_model(bool /*write_back*/) { return nullptr; }
  // The run is over: the model holds its whole weights again.
  virtual void finish() {}
  // FSDP's own object, for the checkpoint code that writes its shards;
  // null for the other plans.
  virtual parallel::FullyShardedDataParallel* fully_sharded() { return nullptr; }

 protected:
  explicit DataPlan(models::Sequence model) : model_(std::move(model)) {}
  models::Sequence model_;
};

// What make_data_plan builds from.
struct DataPlanSetup {
  const TrainOptions* options = nullptr;
  ParallelLayout layout;
  models::Sequence model{nullptr};
  // What the dp dimension replicates: the model, or this rank's pipeline
  // pieces under a mesh (`pieces`, in the model's order).
  std::vector<models::Sequence> pieces;
  std::shared_ptr<dist::ProcessGroup> group;  // the dp group (null: one process or a pipeline's ranks)
  // Parameters the dp plan neither starts alike nor reduces: each rank's
  // own (expert parallelism's experts, Note [expert gradients]).
  std::vector<torch::Tensor> left_out;
  // HSDP (--mesh dp_replicate=R,dp_shard=S): FSDP over the shard group,
  // its gradients averaged over the replicate group; null otherwise.
  std::shared_ptr<dist::ProcessGroup> shard_group, replicate_group;
  int64_t data_ranks = 1;
  torch::Device device{torch::kCPU};  // DataParallel's output device
  int64_t parameter_count = 0;        // the whole model's, for the account
};

// The plan the flags ask for. Collective over the dp group (DDP and the
// all-reduce start every rank from dp rank 0's weights; FSDP shards them).
std::unique_ptr<DataPlan> make_data_plan(const DataPlanSetup& setup);

}  // namespace tandem::engine
