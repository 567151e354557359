// --strategy fsdp over ranks: parallel::FullyShardedDataParallel as a data
// plan (engine/data_plan.h), over the whole model or, under a mesh, over
// this rank's pipeline stage (Note [fsdp under a pipeline]).
//
// Note [hsdp]: --mesh dp_replicate=R,dp_shard=S (PyTorch's HYBRID_SHARD,
// torchtitan's names) lays the dp ranks out as R groups of S consecutive
// ones. FSDP shards over each group of S (its gathers and reduce-scatters
// stay inside it, a node's ranks when S is a node's GPUs); the R ranks
// that hold the same shard average their shards' gradients after the
// reduce-scatter, an all-reduce of 1/S of the gradient's bytes. The
// average over the S ranks then over the R groups is the average over all
// R x S, so HSDP computes what FSDP over every dp rank does, holding R
// copies of each shard. The shards are placed Shard over dp_shard and
// Replicate over dp_replicate: a norm counts them on replica group 0, a
// checkpoint is written by replica group 0's ranks.
#include <algorithm>

#include "data_plans.h"
#include "tandem/dist/collectives.h"
#include "tandem/models/registry.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/table.h"
#include "tandem/util/check.h"

namespace tandem::engine::internal {
namespace {

class FsdpPlan : public DataPlan {
 public:
  FsdpPlan(const DataPlanSetup& setup, models::Sequence sharded, parallel::FsdpOptions options)
      : DataPlan(setup.model),
        replica_(replica_of(setup)),
        group_(setup.group),
        replicate_(setup.replicate_group),
        under_pipeline_(!setup.pieces.empty()),
        full_sharding_(options.reshard_after_forward),
        parameter_count_(setup.parameter_count),
        fsdp_(std::make_unique<parallel::FullyShardedDataParallel>(
            std::move(sharded), setup.shard_group ? setup.shard_group : setup.group, options)) {}
  std::string name() const override { return "fsdp"; }

  std::vector<std::string> describe() const override {
    int64_t largest = 0, shards = 0, whole = 0;
    for (const auto& unit : fsdp_->units()) {
      largest = std::max(largest, unit.numel);
      whole += unit.numel;  // the parameters hold no elements at rest: the units count them
    }
    for (const auto& shard : fsdp_->parameters()) shards += shard.numel();
    const double mib = static_cast<double>(torch::elementSize(models::parameter_dtype(*model_))) / (1 << 20);
    const auto units = static_cast<long long>(fsdp_->units().size());
    if (under_pipeline_) {  // Note [fsdp under a pipeline]
      return {format("fully sharded over each stage's dp ranks (FSDP under a pipeline: the stage gathered once a "
                     "step, over all its micro-batches; %lld unit(s) of up to %lld parameters); between steps each "
                     "rank keeps %.2f MiB of parameters (as much of gradients and momentum) instead of its stage's "
                     "%.2f",
                     units, static_cast<long long>(largest), shards * mib, whole * mib)};
    }
    const std::string hsdp =
        replicate_ ? format(" over each group of %lld dp ranks, the %lld groups' gradients averaged (HSDP)",
                            static_cast<long long>(fsdp_->world_size()), static_cast<long long>(replicate_->size()))
                   : "";
    return {format("fully sharded (FSDP, %s)%s: %lld unit(s) of up to %lld parameters, gathered one at a time "
                   "(%s); each rank keeps %.2f MiB of parameters (as much of gradients and momentum) instead of %.2f",
                   full_sharding_ ? "ZeRO-3: parameters gathered again for backward"
                                  : "ZeRO-2: parameters kept from forward to backward",
                   hsdp.c_str(), units, static_cast<long long>(largest), fsdp_->describe_units().c_str(),
                   shards * mib, parameter_count_ * mib)};
  }

  void begin_step(torch::optim::Optimizer& optimizer) override {
    optimizer.zero_grad();  // the shards' (FSDP broadcasts the buffers in its first forward)
    if (under_pipeline_) dist::broadcast_buffers(*replica_, *group_);  // its stage runs without FSDP's forward
  }
  torch::Tensor forward(const torch::Tensor& x) override { return fsdp_->forward(x); }
  torch::Tensor evaluation_forward(const torch::Tensor& x) override {
    return fsdp_->detached() ? model_->forward(x) : fsdp_->forward(x);
  }
  // Note [fsdp under a pipeline]: the stage gathered once for all the
  // micro-batches, their summed gradients reduce-scattered after them.
  Held begin_micro_batches() override { return whole_model(/*write_back=*/false); }
  void end_micro_batches() override { fsdp_->reduce_accumulated_gradients(); }
  void after_backward() override {
    fsdp_->after_backward();  // units were reduce-scattered during backward
    if (replicate_ && replicate_->size() > 1) {
      // Note [hsdp]: each shard averaged over its shard group, then over
      // the groups that hold the same shard: the average over every dp rank.
      std::vector<torch::Tensor> grads;
      for (const auto& shard : fsdp_->parameters()) {
        if (shard.grad().defined()) grads.push_back(shard.grad());
      }
      replicate_->all_reduce(grads, dist::ReduceOp::kAvg).wait();
    }
  }

  std::vector<torch::Tensor> parameters() const override { return fsdp_->parameters(); }
  // Each shard: Shard(0) over dp of its parameter (of the parameter's tp
  // part under tp), with where its rows lie in the parameter's memory
  // order; a rank without rows of a parameter holds no piece of it.
  std::vector<dist::PlacedTensor> placed_parameters() const override {
    std::vector<std::string> names;
    for (const auto& p : replica_->named_parameters()) names.push_back(p.key());
    const auto& whole = fsdp_->model_parameters();
    TANDEM_CHECK(names.size() == whole.size(), "fsdp: ", names.size(), " named parameters for ", whole.size());
    std::vector<dist::PlacedTensor> placed;
    const auto spans = fsdp_->shard_spans();
    for (size_t i = 0; i < spans.size(); ++i) {
      for (const auto& span : spans[i]) {
        dist::PlacedTensor t{names[span.parameter], fsdp_->parameters()[i], whole[span.parameter]};
        t.flat_offset = span.shard_offset;
        t.flat_numel = span.numel;
        t.parameter_offset = span.offset;
        t.data_parallel = dist::Placement::shard(0, span.shape.empty() ? 1 : span.shape[0]);
        placed.push_back(std::move(t));
      }
    }
    return placed;
  }
  bool sharded() const override { return true; }
  std::unique_ptr<torch::optim::Optimizer> make_optimizer(const optim::OptimizerSettings& settings) override {
    if (settings.kind == optim::OptimizerSettings::Kind::kAdamW) {
      return std::make_unique<parallel::FsdpAdamW>(*fsdp_, settings.adamw);  // Note [fsdp weight decay]
    }
    return std::make_unique<parallel::FsdpSgd>(*fsdp_, settings.sgd);
  }
  Held whole_model(bool write_back) override {
    if (fsdp_->detached()) return nullptr;
    return std::make_shared<parallel::FullyShardedDataParallel::FullParams>(*fsdp_, write_back);
  }
  void finish() override {
    if (!fsdp_->detached()) fsdp_->detach_model();
  }
  parallel::FullyShardedDataParallel* fully_sharded() override { return fsdp_.get(); }

 private:
  std::shared_ptr<torch::nn::Module> replica_;
  std::shared_ptr<dist::ProcessGroup> group_, replicate_;
  bool under_pipeline_, full_sharding_;
  int64_t parameter_count_;
  std::unique_ptr<parallel::FullyShardedDataParallel> fsdp_;
};

}  // namespace

std::unique_ptr<DataPlan> make_fsdp_plan(const DataPlanSetup& setup) {
  const auto& o = *setup.options;
  parallel::FsdpOptions options;
  options.min_unit_numel = o.fsdp_min_unit_params;
  options.reshard_after_forward = o.fsdp_sharding == FsdpSharding::kFull;
  if (setup.pieces.empty()) {
    // Note [fully sharded parameters]: from here on the model's parameters
    // hold no elements outside forward, backward and FullParams.
    options.checkpoint_activations = o.checkpoint_activations > 0;  // --checkpoint-activations 1
    return std::make_unique<FsdpPlan>(setup, setup.model, options);
  }
  // Note [fsdp under a pipeline]: this rank's pieces as one stage; the
  // pipeline's stages recompute themselves.
  models::Sequence stage;
  for (size_t k = 0; k < setup.pieces.size(); ++k) stage->push_back("piece" + std::to_string(k), setup.pieces[k]);
  options.foreign_tied_weights = true;  // Note [tied weights under fsdp]: the head's copy, kept by TiedStages
  return std::make_unique<FsdpPlan>(setup, stage, options);
}

}  // namespace tandem::engine::internal
