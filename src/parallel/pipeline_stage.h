// pipeline_stage.h (private to src/parallel): one stage's side of a pipeline
// step, shared by Pipeline (threads) and DistributedPipeline (ranks). The
// executors differ only in how tensors reach the neighbouring stages: the
// StageLinks.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include <torch/types.h>

#include "tandem/models/sequence.h"
#include "tandem/parallel/pipeline.h"

namespace tandem::parallel::detail {

// How a stage talks to its neighbours. `piece` is the model piece the
// stage runs (chunk c of stage s is piece c * S + s; without interleaving,
// piece s): an activation goes from piece k to k + 1, a gradient from k + 1
// to k, whichever stages hold them. recv_* block until the tensor is there
// (on this stage's device, detached) or throw.
class StageLinks {
 public:
  virtual ~StageLinks() = default;
  virtual torch::Tensor recv_activation(int64_t piece, int64_t micro_batch) = 0;  // from piece - 1
  virtual void send_activation(int64_t piece, int64_t micro_batch, const torch::Tensor& output) = 0;  // to piece + 1
  virtual torch::Tensor recv_gradient(int64_t piece, int64_t micro_batch) = 0;    // from piece + 1
  virtual void send_gradient(int64_t piece, int64_t micro_batch, const torch::Tensor& grad) = 0;  // to piece - 1
};

struct StageJob {
  std::vector<models::Sequence> chunks;  // chunk c is the model's piece c * stages + stage
  int64_t stage = 0, stages = 1;
  torch::Device device{torch::kCPU};
  const std::vector<PipelineAction>* actions = nullptr;
  std::vector<torch::Tensor> inputs;   // first stage (the model's first piece): the micro-batches
  std::vector<torch::Tensor> targets;  // last stage (the model's last piece): the targets
  std::vector<double> weights;         // last stage: rows of micro-batch i / rows of the batch
  const PipelineLoss* loss = nullptr;  // last stage
  const LossScale* scale = nullptr;    // last stage; null or empty: backward from the loss
  bool first() const { return stage == 0; }
  bool last() const { return stage + 1 == stages; }
  std::optional<torch::ScalarType> autocast;  // forward and loss under autocast
  bool recompute = false;                     // PipelineOptions::recompute
  const std::function<void(int64_t)>* before_last_backward = nullptr;  // PipelineOptions'; may be null or empty
  StageLinks* links = nullptr;
  std::chrono::steady_clock::time_point origin;  // the step's start
};

struct StageOutcome {
  PipelineStageTrace trace;
  torch::Tensor loss;                 // last stage: the sum of the weighted losses
  std::vector<torch::Tensor> outputs;  // last stage: per micro-batch, detached
};

// Runs job.actions in order (sets the current CUDA device to job.device).
StageOutcome run_stage(StageJob& job);

// The micro-batches' row counts for a batch of n rows cut in up to m.
std::vector<int64_t> micro_batch_sizes(int64_t n, int64_t m);

}  // namespace tandem::parallel::detail
