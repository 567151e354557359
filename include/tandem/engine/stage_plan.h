// tandem/engine/stage_plan.h: how a step goes through the model's stages,
// the pipeline dimension of a run, one part per form:
//
//   whole model      one stage: forward and backward of the batch, in --grad-accum chunks
//   local pipeline   parallel::Pipeline: the stages on --devices in this process
//   rank pipeline    parallel::DistributedPipeline: this rank's stage of the pp ranks
//
// Note [stage plans]: a step is the data plan's begin_step, the stage
// plan's forward_backward, the data plan's after_backward, clipping and the
// optimizer's step (Trainer::step). forward_backward asks the data plan
// (engine/data_plan.h) to hold its reduction while gradients only
// accumulate: over the --grad-accum chunks but the last, or over a
// pipeline's micro-batches, whose last backward of each chunk it announces
// (Note [reducing during the last backward]). So every data plan composes
// with every stage plan without either knowing the other's kind, which is
// what a device mesh of dp x pp needs.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tandem/data/dataset.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/data_plan.h"
#include "tandem/engine/evaluate.h"
#include "tandem/engine/task.h"
#include "tandem/models/sequence.h"
#include "tandem/optim/grad_scaler.h"
#include "tandem/parallel/pipeline.h"

namespace tandem::engine {

// What every stage plan computes with: the task (engine/task.h), and the
// precision.
struct StepSettings {
  std::shared_ptr<const Task> task;
  std::optional<torch::ScalarType> amp;  // --amp: forward and loss under autocast
  optim::GradScaler* scaler = nullptr;   // --amp fp16: backward from the scaled loss
  bool channels_last = false;            // --channels-last: 4-D inputs in NHWC order (evaluation)
};

// What evaluation reads.
struct EvalSetup {
  const data::Dataset* dataset = nullptr;
  int64_t batch_size = 0;  // the global batch
  int64_t workers = 0;
  std::shared_ptr<dist::ProcessGroup> group;  // the dp group (null: one replica)
  int64_t data_ranks = 1;  // the replicas that read other samples
  SequenceCut cut;         // context parallelism: the part of each sequence scored here
};

class StagePlan {
 public:
  virtual ~StagePlan() = default;
  // Forward and backward of this rank's batch (on the plan's device). The
  // gradients are left for data.after_backward(); each stage's idle share
  // of the step is added to stage_idle (of stages() entries).
  virtual StepOutputs forward_backward(const torch::Tensor& inputs, const torch::Tensor& targets, DataPlan& data,
                                       std::vector<double>& stage_idle) = 0;
  // The pipeline's stages (0: no pipeline).
  virtual int64_t stages() const { return 0; }
  // This stage's index among stages() (the one this rank timed).
  virtual int64_t stage_index() const { return 0; }
  // The model's loss and accuracy on setup.dataset, as run() reports after
  // every epoch; the same on every rank.
  virtual EvalResult evaluate(const EvalSetup& setup, DataPlan& data) = 0;
};

// --grad-accum chunks of `model` on `device`; with --skip-bad-images over
// several dp ranks, each rank's loss weighted by its share of the global
// batch (Note [unequal batches]).
struct WholeModelSettings {
  int64_t grad_accum = 1;
  bool unequal_batches = false;  // --skip-bad-images over several ranks
  std::shared_ptr<dist::ProcessGroup> group;  // the dp group
  int64_t data_ranks = 1;
};
std::unique_ptr<StagePlan> make_whole_model_plan(models::Sequence model, torch::Device device, StepSettings task,
                                                 WholeModelSettings settings);
// `model` cut into stages of `sizes` layers on `devices`, in this process.
std::unique_ptr<StagePlan> make_local_pipeline_plan(models::Sequence model, const std::vector<int64_t>& sizes,
                                                    const std::vector<torch::Device>& devices,
                                                    parallel::PipelineOptions options, StepSettings task);
// This rank's stage of the pp group `stages`: `pieces` (its chunks, in the
// model's order) on `device`. The plan announces each chunk's last backward
// to the data plan of the step.
std::unique_ptr<StagePlan> make_rank_pipeline_plan(models::Sequence model, const std::vector<models::Sequence>& pieces,
                                                   torch::Device device, std::shared_ptr<dist::ProcessGroup> stages,
                                                   parallel::PipelineOptions options, StepSettings task);

}  // namespace tandem::engine
