// tandem/engine/trainer.h: the training loop, one per process.
//
// One flat story, in run(): open the data, build the model and optimizer,
// resume if asked, then for each epoch train (schedule, forward, loss,
// backward, step), evaluate, record, checkpoint; finally export the weights.
// A step composes three parts (Note [stage plans], Note [mesh plan]): the
// data-parallel dimension's DataPlan (engine/data_plan.h), the pipeline
// dimension's StagePlan (engine/stage_plan.h) and the MeshPlan
// (engine/mesh_plan.h: the groups, tp's cut, tied weights), each asked at
// its phases.
#pragma once

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/dataset.h"
#include "tandem/dist/device_mesh.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/data_plan.h"
#include "tandem/engine/evaluate.h"
#include "tandem/engine/mesh_plan.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/run_setup.h"
#include "tandem/engine/stage_plan.h"
#include "tandem/engine/tied_stages.h"
#include "tandem/engine/train_options.h"
#include "tandem/models/sequence.h"
#include "tandem/observe/metrics.h"
#include "tandem/observe/profile.h"
#include "tandem/optim/grad_scaler.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/parallel/tensor_parallel_plan.h"

namespace tandem::engine {

struct TrainResult {
  std::vector<observe::EpochMetrics> epochs;  // one per epoch trained in this run
  int64_t steps = 0;                 // optimizer steps taken in all
  double seconds = 0.0;              // wall time of this run
  std::string last_checkpoint;       // empty when none was written
  int64_t graph_replays = 0;         // --cuda-graph: steps replayed from the graph
  int64_t graph_eager_steps = 0;     // --cuda-graph: steps run eagerly (warm-up, odd-sized batches)
};


class Trainer {
 public:
  // Throws tandem::Error naming the flag for invalid options.
  // The job's ranks: those of `job` when given (Note [a job the program
  // made]), else those the environment names (a launcher's RANK,
  // WORLD_SIZE, MASTER_ADDR), else this process alone.
  explicit Trainer(TrainOptions options, std::FILE* log = stderr, std::shared_ptr<dist::ProcessGroup> job = nullptr);

  TrainResult run();

  // The model on the evaluation data (data().test), as run() evaluates it
  // after every epoch: through the pipeline's stages, under autocast, in
  // channels-last order, split over the ranks. Throws tandem::Error when
  // there is no evaluation data.
  EvalResult evaluate();

  // Prints, on `to`, the data's warnings not yet printed (the images left
  // out by --skip-bad-images), this process's only: every rank reports what
  // its own share met. run() prints them on its log after every epoch,
  // whatever the rank; `tandem eval` after evaluating.
  void report_warnings(std::FILE* to) const;

  models::Sequence& model() { return model_; }
  int64_t rank() const { return rank_; }
  int64_t world_size() const { return world_; }
  const data::DataSplits& data() const { return data_; }
  const TrainOptions& options() const { return options_; }

  // The settings a checkpoint must share with the run that resumes it.
  std::string fingerprint() const;

  // The settings every rank of the job must share, as KEY=VALUE words
  // (Note [same settings] in src/engine/trainer_setup.cpp).
  std::string job_settings() const;

  // What --export-weights writes beside the weights (docs/DATA.md): the
  // model, and the classes its outputs are: "num_classes", then "classes"
  // (a JSON list of the class folders) for named classes, or "labels" (the
  // data format: idx, cifar10, cifar100) for numbered ones.
  std::map<std::string, std::string> weights_metadata() const;

  // Refuses weights whose metadata (weights_metadata of the run that wrote
  // them) says they are of another model or for other classes than this
  // trainer's --data; a key the file lacks (an older export) is not checked.
  // Throws tandem::Error naming `path`.
  void check_weights_metadata(const std::map<std::string, std::string>& metadata, const std::string& path) const;

  // The settings other than --model and the classes that shape the model's
  // tensors, as weights_metadata records them: "image_size" (the side of
  // the images after transforms), "width_mult" (mobilenetv2) and "stem"
  // (resnets: cifar or imagenet, --stem auto resolved).
  std::map<std::string, std::string> shape_settings() const;

  // engine::load_weights into the model, leaving out the names under
  // `except`; a file whose tensors do not fit also has its shape settings
  // that differ from this run's named as flags (Note [shape settings]).
  void load_weights(const checkpoint::SafetensorsFile& file, const std::string& path,
                    const std::vector<std::string>& except = {});
  int64_t virtual_stages() const;  // --virtual-stages, its default resolved

 private:
  // Gathers every rank's job_settings() and throws tandem::UsageError,
  // naming the fields, on every rank when any differs from rank 0's.
  void check_same_settings() const;
  // Refuses a model with a tied embedding under a strategy that would keep
  // the tie's two ends apart (Note [tied embedding] in models/gpt2.h).
  void check_tied_weights(bool pipeline) const;
  // Where the run starts: --checkpoint-dir opened (rank 0 checks, locks and
  // cleans it), and with --resume (or when a launcher restarted this
  // worker) the newest good checkpoint loaded into the model, `optimizer`,
  // the position and the loss scale.
  struct Resumption {
    std::optional<checkpoint::Checkpointer> checkpointer;
    bool resume = false;         // asked to resume (by --resume or a restart)
    checkpoint::TrainPosition position;      // where the run goes on
    std::string started_from;    // for the advice should it diverge (Note [diverged])
  };
  Resumption open_checkpoints(torch::optim::Optimizer& optimizer);
  // The run's account before its first step (rank 0): the layout and what
  // each flag came to, warnings for flags without effect.
  void announce(int64_t steps_per_epoch, const optim::ShardedState* zero) const;
  // A line of the run's account (rank 0; not with --progress off).
  void say(const std::string& line) const;
  // A line the run prints whatever --progress (rank 0): where it started
  // from when it resumed.
  void notice(const std::string& line) const;
  // "tandem: warning: LINE" (rank 0, whatever --progress): a flag that had
  // no effect, something skipped or removed.
  void warn(const std::string& line) const;
  // The stage plan: the pipeline's cut and devices, or the whole model.
  void make_pipeline(const data::DatasetInfo& info);
  void make_rank_pipeline(const data::DatasetInfo& info);
  StepSettings step_settings() const;  // the task, autocast, the fp16 scaler
  std::pair<std::vector<int64_t>, std::string> pipeline_cut(const data::DatasetInfo& info, int64_t stages,
                                                            const torch::Device& on, bool measure,
                                                            const std::string& where);
  // FSDP x pipeline (Note [fsdp x pipeline checkpoints] in
  // trainer_stages.cpp): the plain optimizer (SGD, or AdamW in its decay
  // groups) over the whole model with `sharded`'s options and,
  // `with_state`, this stage's state gathered over its dp ranks (a
  // collective); and the way back, this rank keeping its shards' slices of
  // `whole`'s state. Both while the whole model is held (its shapes).
  std::unique_ptr<torch::optim::Optimizer> whole_model_optimizer(torch::optim::Optimizer& sharded, bool with_state);
  void keep_shards_of(const torch::optim::Optimizer& whole, torch::optim::Optimizer& sharded);
  // Note [held state] (trainer_shards.cpp): the pieces of the model and
  // optimizer state this rank writes into a sharded checkpoint (kWrite),
  // or every piece it holds, to be filled by a resume (kRead), no collective:
  // views of its tensors, or copies put back by `write_backs`, and the
  // optimizer's state as fresh tensors to be made its own once filled.
  enum class StateUse { kWrite, kRead };
  struct HeldState {
    std::vector<checkpoint::StatePiece> pieces;
    std::vector<std::function<void()>> write_backs;
    struct Fresh {
      torch::Tensor parameter;                       // what the optimizer steps
      std::map<std::string, torch::Tensor> state;    // by slot
      std::vector<std::string> names;                // the checkpoint's names of them
    };
    std::vector<Fresh> state;
  };
  HeldState state_pieces(torch::optim::Optimizer& optimizer, StateUse use) const;
  // A resume from one checkpoint: a sharded one's overlapping pieces read
  // into what this rank holds (Note [loading by overlap]), or a one-file
  // one loaded whole and cut to this rank's layout. Throw as
  // Checkpointer::load does.
  checkpoint::TrainPosition load_held(const checkpoint::Checkpointer& checkpointer, const std::string& dir,
                                      torch::optim::Optimizer& optimizer);
  checkpoint::TrainPosition load_whole(const checkpoint::Checkpointer& checkpointer, const std::string& file,
                                       torch::optim::Optimizer& optimizer);
  // Whether checkpoints are sharded: --checkpoint-format, auto resolved.
  bool sharded_checkpoints() const;
  // What one epoch's steps add up for its report.
  struct StepCounters {
    std::vector<double> stage_idle;  // --strategy pipeline: per stage, summed over steps
    int64_t pipeline_steps = 0;
    int64_t skipped_steps = 0;  // --amp fp16: steps skipped for inf/NaN gradients
  };
  // run()'s phases (trainer.cpp, trainer_epoch.cpp, trainer_resume.cpp):
  // the set-up, one epoch (its steps, evaluation, record and checkpoint),
  // the end. Their state is src/engine/trainer_run.h's.
  struct RunState;
  struct EpochState;
  std::unique_ptr<RunState> prepare_run();
  void train_epoch(RunState& run);
  // Folds the device-side sums into the position; over all ranks, so every
  // rank calls it at the same steps (a collective). A loss that is no longer
  // finite ends the run on every rank (Note [diverged]).
  void sync_sums(RunState& run, EpochState& epoch);
  observe::EpochMetrics end_epoch(RunState& run, EpochState& epoch);
  // The peak FLOPs a second of the job's devices, 0 when unknown (Note
  // [peak for MFU] in src/engine/trainer_account.cpp).
  double peak_flops() const;
  void report_pipeline_idle(StepCounters& counters) const;
  // A checkpoint of the position (each rank its pieces, or the whole on rank 0).
  void save(RunState& run);
  TrainResult finish_run(RunState& run);
  // Where the trained weights are when an output written at the end failed
  // (Note [trained weights are never lost]): `checkpoint`, the last one
  // written, or a file written now; a sentence for the error.
  std::string keep_trained_weights(const std::string& checkpoint, const checkpoint::NamedTensors& tensors) const;
  // This rank's weights and buffers, checked at every sync (Note [diverged]).
  std::vector<std::pair<std::string, torch::Tensor>> weights_and_buffers() const;
  // Ends the run: `what` diverged at `when` (Note [diverged]).
  [[noreturn]] void diverged(RunState& run, const std::string& what, const std::string& when, double lr) const;
  // One training step as the strategy says: zero the gradients, forward and
  // loss (autocast), backward (in --grad-accum chunks), reduce over the
  // ranks, clip (--clip-grad-norm), optimizer step (with the loss scaler).
  // The plain form (one process, one device) is what --cuda-graph captures.
  StepOutputs step(const torch::Tensor& inputs, const torch::Tensor& targets,
                   torch::optim::Optimizer& optimizer, StepCounters& counters);
  void clip_gradients();  // --clip-grad-norm, over the ranks that hold the gradients
  std::vector<dist::PlacedTensor> placed_parameters(bool gradients = false) const;  // Note [placements]
  void seed_dropout(int64_t step) const;  // Note [dropout seeds]

  TrainOptions options_;
  std::FILE* log_;
  std::FILE* warnings_log_;  // log_ before ranks other than 0 were silenced
  torch::Device device_;
  data::DataSplits data_;
  models::Sequence model_{nullptr};
  ParallelLayout layout_;  // the mesh, the pipeline and the dp dimension's strategy
  // Note [mesh plan]: the job's groups (the dp slice is groups.data, the pp
  // slice groups.pipeline: Note [replicated stages], [pipeline over ranks])
  // and the parts that split the model over them (tp's cut, tied weights).
  MeshPlan mesh_;
  // The dp dimension (engine/data_plan.h): one process, all-reduce, DDP,
  // FSDP or DataParallel, over the model or this rank's pipeline pieces.
  std::unique_ptr<DataPlan> plan_;
  // The pp dimension (engine/stage_plan.h): the whole model, a pipeline in
  // this process, or this rank's stage of a pipeline over ranks.
  std::unique_ptr<StagePlan> stage_plan_;
  std::string pipeline_split_;                              // its stages, for the log
  std::optional<torch::ScalarType> amp_;                    // --amp: the autocast dtype
  std::unique_ptr<optim::GradScaler> scaler_;               // --amp fp16
  std::unique_ptr<observe::StepProfiler> profiler_;                  // --profile-out (off when not given)
  std::shared_ptr<const Task> task_;  // what the model is trained to do
  int64_t rank_ = 0, world_ = 1;  // world_: data-parallel ranks (1 for a pipeline over ranks)
  int64_t data_rank_ = 0;         // this rank's place among world_ (the sampler's rank)
  int64_t job_world_ = 1;         // the job's processes
  int64_t parameter_count_ = 0;  // counted before FSDP empties the parameters
  int64_t channels_last_weights_ = 0;  // --channels-last: the 4-D weights put in NHWC order
  int64_t tokens_per_sample_ = 0;  // a language model's --seq-len: predictions per sample (0: images, one)
  double flops_per_token_ = 0;     // a language model's, for MFU (models::ModelTraits)
  int64_t experts_ = 0;            // a mixture of experts' (engine/expert_load.h); 0: none
};


}  // namespace tandem::engine
