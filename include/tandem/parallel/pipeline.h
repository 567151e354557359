// tandem/parallel/pipeline.h: pipeline parallelism (seed 001): GPipe, 1F1B
// and interleaved 1F1B.
//
// A model cut into stages (stage_split.h), one device per stage. Each
// training step cuts the batch into M micro-batches (sizes as even as
// possible) and runs a schedule (pipeline_schedule.h): stage s runs F(i),
// the forward of micro-batch i, once stage s - 1 has sent it F(i)'s output,
// and B(i) once stage s + 1 has sent it the gradient of that output. While
// stage 1 works on micro-batch i, stage 0 already works on i + 1: seed
// 001's split_size loop, generalised to S stages and either schedule.
//
//   Pipeline pipe(model, /*sizes=*/{4, 8}, {cpu, cpu}, {/*micro_batches=*/4, "1f1b"});
//   auto step = pipe.train_step(images, labels, loss_fn);  // gradients are in model
//   optimizer.step();
//
// Arithmetic: the last stage scales micro-batch i's mean loss by n_i / N, so
// the gradients that accumulate in the parameters over the M backwards are
// those of the batch's mean loss, as without a pipeline (up to rounding);
// step.loss is that mean. A stage's input is the previous stage's output,
// detached and marked as requiring grad; its gradient is what goes back.
// BatchNorm normalises over each micro-batch, as in GPipe.
//
// Interleaved 1F1B (PipelineOptions::virtual_stages = V > 1, schedule
// "interleaved"): the model is cut into S * V pieces and stage s runs
// pieces s, s + S, s + 2S, ... (its chunks; pipeline_schedule.h), so an
// activation leaving the last stage's chunk c enters the first stage's
// chunk c + 1. The bubble shrinks by about V, for V - 1 more hand-offs
// per micro-batch and stage boundary.
//
// Two executors run the same per-stage action lists:
//   Pipeline             one process, one thread per stage; activations and
//                        gradients move between stages by Tensor::to(device)
//   DistributedPipeline  one stage per rank of a process group; activations
//                        and gradients go by send/recv (each preceded by a
//                        small header with its dtype and shape), sends are
//                        asynchronous and waited for at the end of the step
//
// Failure: in one process, a stage that throws stops the others (they are
// woken, not left waiting) and train_step rethrows its error, naming the
// stage and device. Across processes, a receive that waits longer than the
// group's timeout, or on a peer that died, throws naming the stage.
//
// Note [intra-op settings of new threads]: OpenMP's team size and MKL's
// thread count are per thread, and ATen applies at::set_num_threads to a
// thread only lazily, on that thread's first ATen parallel_for. A convolution
// or matrix product that calls oneDNN or MKL directly does not get there, so
// a fresh thread's products (a stage of Linear layers never does) run with
// the libraries' defaults: a team of every core, not the process's count.
// The threads that compute for the caller (pipeline stages here, replicas in
// data_parallel.cpp) therefore call at::init_num_threads() before their
// work, as libtorch's own autograd and inter-op threads do. Tested:
// PipelineTest.StageThreadsComputeWithTheProcesssThreadCount and
// DataParallelTest.ReplicaThreadsComputeWithTheProcesssThreadCount.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/process_group.h"
#include "tandem/models/sequence.h"
#include "tandem/parallel/model_parallel.h"
#include "tandem/parallel/pipeline_schedule.h"

namespace tandem::parallel {

namespace detail {
class TaskThread;  // src/parallel/task_thread.h
}

struct PipelineOptions {
  int64_t micro_batches = 4;       // --micro-batches
  std::string schedule = "1f1b";   // --schedule: gpipe | 1f1b | interleaved
  // --amp: each micro-batch's forward (and on the last stage its loss) runs
  // under autocast to this dtype on its stage's device; backward runs
  // outside autocast, as PyTorch advises. Activations and their gradients
  // cross stages in whatever dtype autocast left them.
  std::optional<torch::ScalarType> autocast;
  // Pipeline (threads): how long a stage waiting for an activation or a
  // gradient polls for it, yielding between polls, before it sleeps (Note
  // [spinning hand-offs] in src/parallel/pipeline.cpp). 0: sleep at once.
  std::chrono::microseconds spin{1000};
  // --virtual-stages: model chunks per stage (only with "interleaved").
  int64_t virtual_stages = 1;
  // GPipe's re-materialization: each stage keeps only its micro-batches'
  // inputs, not their activations, and runs a micro-batch's forward again
  // just before its backward (models::checkpoint_activations; the same
  // gradients, for one more forward per micro-batch and stage).
  bool recompute = false;
  // DistributedPipeline: called on this stage with chunk c just before the
  // last backward of c in the step, after which c's gradients are final.
  // Note [reducing during the last backward]: DDP over the stage's
  // replicas stops accumulating there, so that its buckets are reduced
  // while that backward and the rest of the step run.
  std::function<void(int64_t chunk)> before_last_backward = {};
};

// One micro-batch's loss: the mean over its rows (e.g. cross-entropy).
using PipelineLoss =
    std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;
// What the last stage's backward starts from, given a micro-batch's
// weighted loss: e.g. GradScaler::scale for --amp fp16. Empty: the loss.
// The step's reported loss is never scaled.
using LossScale = std::function<torch::Tensor(const torch::Tensor& loss)>;

// What one stage did in a step. Times are seconds since the step began; an
// action's interval excludes the wait for its input, so busy time over the
// step's length is the stage's utilisation.
struct PipelineStageTrace {
  std::vector<PipelineAction> actions;
  std::vector<double> start, end;
  int64_t max_in_flight = 0;  // most micro-batches whose forward ran and backward had not
  double busy() const;
};

struct PipelineStep {
  torch::Tensor loss;    // the batch's mean loss (detached); undefined off the last stage
  torch::Tensor output;  // the last stage's outputs, concatenated (detached); likewise
  int64_t micro_batches = 0;
  double seconds = 0;    // the step's wall time
  std::vector<PipelineStageTrace> stages;  // Pipeline: every stage; DistributedPipeline: this rank's
  // Per traced stage: 1 - busy / seconds (the bubble, plus any overhead).
  std::vector<double> idle_share() const;
};

class Pipeline {
 public:
  // Cuts `model` into pieces of `sizes` children, piece k on devices[k % S]
  // (moved there), S = devices.size(): one piece per device, or with
  // virtual_stages V, S * V pieces. Throws tandem::Error for sizes that do
  // not fit the devices, an unknown schedule, virtual stages without the
  // interleaved schedule or micro_batches < 1.
  Pipeline(models::Sequence model, const std::vector<int64_t>& sizes,
           std::vector<torch::Device> devices, PipelineOptions options = {});
  ~Pipeline();

  // Forward and backward of one batch through the schedule; the gradients
  // accumulate into the model's parameters. `input` and `target` may be on
  // any device (moved to the first and last stage's). A batch of fewer rows
  // than micro-batches uses one micro-batch per row.
  PipelineStep train_step(const torch::Tensor& input, const torch::Tensor& target,
                          const PipelineLoss& loss, const LossScale& scale = {});

  // The whole batch through the pieces in turn, no micro-batches (for
  // evaluation); the output is on the last stage's device.
  torch::Tensor forward(const torch::Tensor& input) { return chain_->forward(input); }

  // One per stage.
  const std::vector<torch::Device>& devices() const { return devices_; }
  // The model's pieces in order (piece k runs on devices()[k % S]).
  const std::vector<models::Sequence>& pieces() const { return chain_->stages(); }
  const PipelineOptions& options() const { return options_; }

 private:
  PipelineOptions options_;
  std::vector<torch::Device> devices_;
  ModelParallel chain_{nullptr};
  std::vector<std::unique_ptr<detail::TaskThread>> workers_;  // stages 1.., kept across steps
};

class DistributedPipeline {
 public:
  // This rank runs stage group->rank() of group->size(), `stage` on
  // `device`. Every rank must use the same options.
  DistributedPipeline(models::Sequence stage, torch::Device device,
                      std::shared_ptr<dist::ProcessGroup> group, PipelineOptions options = {});
  // Interleaved: this rank's chunks, chunk c being the model's piece
  // c * S + rank; options.virtual_stages must be chunks.size().
  DistributedPipeline(std::vector<models::Sequence> chunks, torch::Device device,
                      std::shared_ptr<dist::ProcessGroup> group, PipelineOptions options = {});
  ~DistributedPipeline();

  // `input` is read on the first stage, `target` on the last (others may
  // pass undefined tensors). A batch of fewer rows than micro-batches uses
  // one micro-batch per row, as Pipeline does; every stage must then know
  // the rows: from `input` or `target` when given, else from `rows` (a
  // stage given none of the three assumes at least `micro_batches` rows).
  // step.loss is broadcast to every rank; step.output stays on the last.
  PipelineStep train_step(const torch::Tensor& input, const torch::Tensor& target,
                          const PipelineLoss& loss, const LossScale& scale = {}, int64_t rows = 0);

  // The whole batch through the model's pieces in order, no micro-batches
  // (for evaluation; run it under torch::NoGradGuard): `input` is read on
  // the first stage, each piece's output goes to the next piece's rank, and
  // the last piece's output is returned on the last stage (undefined on the
  // others). Every rank must call it, with batches of the same rows.
  torch::Tensor forward(const torch::Tensor& input);

  int64_t stage_index() const;
  int64_t stage_count() const;

 private:
  std::vector<models::Sequence> chunks_;
  torch::Device device_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::shared_ptr<dist::ProcessGroup> gradients_;  // gradients' own group (Note [pipeline messages])
  // Interleaved only: the last stage's activations to the first, the
  // first's gradients to the last, each over a group of its own.
  std::shared_ptr<dist::ProcessGroup> wrap_activations_, wrap_gradients_;
  PipelineOptions options_;
};

}  // namespace tandem::parallel
