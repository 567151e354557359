// What the flags alone do not say, checked and completed once they are
// parsed (train_sweep.h): flags that exclude each other, flags given for a
// feature the run lacks, and AdamW's defaults.
#include <algorithm>
#include <filesystem>
#include <string>

#include "tandem/cli/flags.h"
#include "tandem/dist/device_mesh.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/train_options.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "train_sweep.h"

namespace tandem::cli::internal {

void complete_train_options(engine::TrainOptions& o, const FlagSet& flags) {
  if (flags.given("batch-size") && flags.given("batch-per-process")) {
    throw UsageError("give --batch-size (the global batch) or --batch-per-process, not both");
  }
  // --init-weights DIR alone, DIR a transformers folder: the model its
  // config.json describes (--model hf:DIR).
  std::error_code ec;
  if (!flags.given("model") && !o.init_weights.empty() && std::filesystem::is_directory(o.init_weights, ec) &&
      std::filesystem::exists(o.init_weights + "/config.json", ec)) {
    o.model = "hf:" + o.init_weights;
  }
  check_flags_that_apply(o, flags);
  apply_optimizer_defaults(o, flags);
}

// A flag of something this run does not have, given at its default value,
// would change nothing and say nothing (the engine's checks see values,
// not what was given): it is named, as the engine names a changed one.
void check_flags_that_apply(const engine::TrainOptions& o, const FlagSet& flags) {
  const bool pipeline = engine::pipelined(o) || o.mesh.is_auto();  // auto may choose one
  for (const char* flag : {"micro-batches", "schedule", "virtual-stages", "pipeline-split", "pipeline-balance"}) {
    if (!pipeline && flags.given(flag)) {
      throw UsageError(std::string("--") + flag + " goes with a pipeline (--strategy pipeline, or --mesh with "
                       "pp > 1); this run has none");
    }
  }
  for (const char* flag : {"fsdp-sharding", "fsdp-min-unit-params"}) {
    if (o.strategy != engine::Strategy::kFsdp && flags.given(flag)) {
      throw UsageError(std::string("--") + flag + " goes with --strategy fsdp; this run's is " +
                       engine::strategy_name(o.strategy));
    }
  }
  if (o.export_hf.empty() && flags.given("export-hf-shard-gb")) {
    throw UsageError("--export-hf-shard-gb goes with --export-hf (the largest shard of its folder)");
  }
  const int64_t tp = o.mesh[dist::MeshDim::kTensor];
  if (pipeline && tp > 1 && flags.given("pipeline-balance") && o.pipeline_balance != engine::PipelineBalance::kParams) {
    throw UsageError("--pipeline-balance " + engine::option_name(o.pipeline_balance) + ": a pipeline with tp > 1 "
                     "is cut by parameter count (its tp ranks must cut alike); give --pipeline-balance params, "
                     "--pipeline-split, or neither");
  }
  const auto& shape = o.mesh.shape();
  if (pipeline && (shape.ep > 1 || shape.cp > 1) && flags.given("pipeline-balance") &&
      o.pipeline_balance != engine::PipelineBalance::kParams) {
    throw UsageError("--pipeline-balance " + engine::option_name(o.pipeline_balance) + ": a pipeline with " +
                     (shape.ep > 1 ? "ep" : "cp") + " > 1 is cut by parameter count (its layers talk to other "
                     "ranks, so one rank cannot time them); give --pipeline-balance params, --pipeline-split, "
                     "or neither");
  }
  if (pipeline && o.dropout > 0 && flags.given("pipeline-balance") &&
      o.pipeline_balance != engine::PipelineBalance::kParams) {
    throw UsageError("--pipeline-balance " + engine::option_name(o.pipeline_balance) + " with --dropout: dropout's "
                     "masks are drawn per stage, so every run of the job (a resumed one too) must cut the model "
                     "alike, which measured times do not; give --pipeline-balance params, --pipeline-split, or "
                     "neither");
  }
}

// AdamW's own --lr and --weight-decay where the command line gives none
// (the table's defaults are SGD's).
void apply_optimizer_defaults(engine::TrainOptions& o, const FlagSet& flags) {
  const auto names = models::model_names();
  if (std::find(names.begin(), names.end(), o.model) == names.end()) return;  // check_train_options names it
  if (engine::resolved_optimizer(o) != engine::Optimizer::kAdamW) return;
  if (flags.given("momentum")) {
    throw UsageError("--momentum is SGD's; the optimizer is adamw (--beta1 is its first-moment decay)");
  }
  if (!flags.given("lr")) o.lr = engine::kAdamWLr;
  if (!flags.given("weight-decay")) o.weight_decay = engine::kAdamWWeightDecay;
}

}  // namespace tandem::cli::internal
