// tandem/engine/train_options.h: everything a training run is told.
//
// The CLI fills this from flags (train_flags() in src/cli/train_command.cpp holds the table and
// the defaults shown by --help); library users fill it directly.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "tandem/dist/device_mesh.h"

namespace tandem::engine {

// The flags with a fixed set of values are enums, parsed once where the
// flags are (cli::FlagSet::add_enum); each has its names on the command
// line, in --help's order, its name back (option_name; also `out << e`, as
// messages print it), and nothing else compares their words.
template <class E>
using EnumNames = std::vector<std::pair<std::string, E>>;

// --dtype: the parameters' and the compute's floating-point type.
enum class Dtype { kFloat32, kFloat64 };
const EnumNames<Dtype>& dtype_names();
// --schedule: the pipeline's order of forwards and backwards
// (parallel/pipeline_schedule.h).
enum class Schedule { kGpipe, k1F1B, kInterleaved };
const EnumNames<Schedule>& schedule_names();
// --dist-backend: auto (NCCL on CUDA, Gloo on the CPU), gloo, nccl.
enum class DistBackend { kAuto, kGloo, kNccl };
const EnumNames<DistBackend>& dist_backend_names();
// --pipeline-balance: the stages cut by measured time or by parameters.
enum class PipelineBalance { kTime, kParams };
const EnumNames<PipelineBalance>& pipeline_balance_names();
// --fsdp-sharding: full (ZeRO-3) or grad-op (ZeRO-2) (parallel/fsdp.h).
enum class FsdpSharding { kFull, kGradOp };
const EnumNames<FsdpSharding>& fsdp_sharding_names();
// --progress: auto (a bar on a terminal, else lines), bar, lines, off.
enum class ProgressMode { kAuto, kBar, kLines, kOff };
const EnumNames<ProgressMode>& progress_names();
enum class AmpMode { kOff, kBf16, kFp16 };  // --amp (optim/amp.h parses the name into a dtype)
const EnumNames<AmpMode>& amp_names();
enum class DdpCommHook { kAllReduce, kFp16, kBf16 };  // --ddp-comm-hook (parallel/comm_hook.h, by name)
const EnumNames<DdpCommHook>& ddp_comm_hook_names();
enum class CheckpointFormat { kAuto, kFile, kSharded };  // --checkpoint-format
const EnumNames<CheckpointFormat>& checkpoint_format_names();

// --strategy, parsed once where the flags are: auto (ddp with several
// ranks), none, ddp, allreduce (seed 004's hand-written loop), fsdp, dp
// (DataParallel in one process), pipeline.
enum class Strategy { kAuto, kNone, kDdp, kAllReduce, kFsdp, kDp, kPipeline };
// Each strategy's name on the command line, in --help's order.
const EnumNames<Strategy>& strategy_names();
// The name of `s` ("fsdp"); also as `out << s`, as messages print it.
const std::string& strategy_name(Strategy s);
std::ostream& operator<<(std::ostream& out, Strategy s);

// --optimizer: auto (adamw for language models, sgd for image
// classifiers), sgd (optim/sgd.h), adamw (optim/adamw.h).
enum class Optimizer { kAuto, kSgd, kAdamW };
const EnumNames<Optimizer>& optimizer_names();

const std::string& option_name(Optimizer o);
const std::string& option_name(Dtype d);
const std::string& option_name(Schedule s);
const std::string& option_name(DistBackend b);
const std::string& option_name(PipelineBalance b);
const std::string& option_name(FsdpSharding s);
const std::string& option_name(ProgressMode p);
const std::string& option_name(AmpMode a);
const std::string& option_name(DdpCommHook h);
const std::string& option_name(CheckpointFormat f);
std::ostream& operator<<(std::ostream& out, Optimizer o);
std::ostream& operator<<(std::ostream& out, Dtype d);
std::ostream& operator<<(std::ostream& out, Schedule s);
std::ostream& operator<<(std::ostream& out, DistBackend b);
std::ostream& operator<<(std::ostream& out, PipelineBalance b);
std::ostream& operator<<(std::ostream& out, FsdpSharding s);
std::ostream& operator<<(std::ostream& out, ProgressMode p);
std::ostream& operator<<(std::ostream& out, AmpMode a);
std::ostream& operator<<(std::ostream& out, DdpCommHook h);
std::ostream& operator<<(std::ostream& out, CheckpointFormat f);

// The defaults the CLI gives --lr and --weight-decay when the optimizer is
// AdamW and they are not given (nanoGPT's GPT-2 settings).
inline constexpr double kAdamWLr = 6e-4;
inline constexpr double kAdamWWeightDecay = 0.1;

// --mesh: the text as given (messages quote the user's spelling) and the
// shape it lays out, parsed once, when set. Empty: not given (the
// strategy's shorthand lays the ranks out: parallel_layout.h).
class MeshFlag {
 public:
  MeshFlag() = default;
  // Throws tandem::UsageError naming --mesh (dist::parse_mesh).
  MeshFlag(std::string text);  // NOLINT: a flag's text converts
  MeshFlag(const char* text) : MeshFlag(std::string(text)) {}  // NOLINT
  bool empty() const { return text_.empty(); }
  // --mesh auto: the planner's choice, made by tandem train's launcher
  // before its workers start (cli/auto_mesh.h); a worker never sees it.
  bool is_auto() const { return text_ == "auto"; }
  const std::string& text() const { return text_; }
  // The sizes given (all 1 when empty); its size() is the ranks it lays out.
  const dist::MeshShape& shape() const { return shape_; }
  int64_t operator[](dist::MeshDim dim) const { return shape_[dim]; }
  // The shape, checked against a job of `ranks`: throws tandem::UsageError
  // naming --mesh where the sizes' product differs.
  dist::MeshShape for_ranks(int64_t ranks) const;
  bool operator==(const MeshFlag& other) const { return text_ == other.text_; }

 private:
  std::string text_;
  dist::MeshShape shape_;
};
std::ostream& operator<<(std::ostream& out, const MeshFlag& mesh);  // the text

// Note [option sections]: what a run is told comes in sections, each a
// type of its own with its own checks (check_section below), so that a
// part that needs one section takes that one (parallel_layout takes the
// parallelism and the model's name, not the whole run). TrainOptions is
// all of them; its fields keep their flat names (o.lr, o.mesh), as the
// flags do. Checks across sections (--cuda-graph with a pipeline, --amp
// with --dtype) are check_train_options' own.

// Data: what is read and how.
struct DataSection {
  std::string data = "fashion-mnist";  // see data/source.h
  std::string val_data;                // evaluation data; empty: data's test split
  int64_t workers = 0;                 // loader threads (0: load on the training thread)
  std::string augment;                 // transform preset (data/augment.h); empty: the data's default
  int64_t image_size = 0;              // images resized/cropped to this (0: the data's default)
  bool skip_bad_images = false;        // leave unreadable images out, with a warning
  int64_t seq_len = 0;     // token data: tokens a sample's inputs hold (0: the model's context, at most 1024)
  int64_t vocab_size = 0;  // token data: the vocabulary where the files do not say it (0: the files')
  std::string tokenizer;   // token data: text tokenized with it, the vocabulary its own (data/tokenizer.h)
};

// Model: what is trained, in what precision.
struct ModelSection {
  std::string model = "convnet";
  double width_mult = 1.0;
  double dropout = 0.0;  // GPT-2's embeddings, attention probabilities and residuals
  std::string stem = "auto";
  std::string init_weights;  // safetensors file to start from (checkpoint/safetensors.h load_weights)
  std::string init_weights_except;  // comma-separated names it leaves at random, e.g. "fc"
  Dtype dtype = Dtype::kFloat32;  // parameters and compute
  AmpMode amp = AmpMode::kOff;    // mixed precision: autocast to bf16 or fp16 (optim/amp.h)
  bool channels_last = false;     // 4-D weights and inputs in NHWC memory order
  bool cudnn_benchmark = false;   // let cuDNN time its convolution algorithms (CUDA only)
  bool cuda_graph = false;        // capture the step as a CUDA graph (engine/cuda_graph.h)
};

// Optimisation: the optimizer, its schedule, the batch and the step.
struct OptimSection {
  int64_t epochs = 5;
  int64_t batch_size = 256;  // global batch
  int64_t batch_per_process = 0;  // > 0: the global batch is this times the world size instead
  Optimizer optimizer = Optimizer::kAuto;
  double lr = 0.1;           // peak learning rate (the CLI's default with adamw: kAdamWLr)
  double min_lr = 0.0;
  double warmup_epochs = 0.2;  // a short linear warmup: steadier first epochs at lr 0.1
  double momentum = 0.9;
  bool nesterov = false;
  double weight_decay = 5e-4;  // SGD's L2 term; AdamW's decoupled decay of matrices (CLI default: kAdamWWeightDecay)
  double beta1 = 0.9, beta2 = 0.95;  // AdamW's moment decays (GPT-3's, nanoGPT's and llm.c's)
  double adam_eps = 1e-8;
  double label_smoothing = 0.0;
  int64_t max_steps = 0;  // stop after this many optimizer steps (0: no limit)
  int64_t grad_accum = 1;       // chunks each rank's batch is passed in before one step
  double clip_grad_norm = 0.0;  // global gradient 2-norm limit (optim/clip.h); 0: off
  int64_t checkpoint_activations = 0;  // segments recomputed in backward (models/activation_checkpoint.h); 0: off
};

// Parallelism: how the ranks are laid out and each dimension is done (the
// world comes from RANK, WORLD_SIZE, ... : dist/rendezvous.h).
struct ParallelSection {
  Strategy strategy = Strategy::kAuto;  // --strategy (kStrategyNames)
  MeshFlag mesh;                      // the ranks as pp x dp x tp, e.g. "dp=2,pp=2" (engine/parallel_layout.h);
                                      // empty: from --strategy
  std::string devices;                // --strategy dp or pipeline: e.g. "cpu,cpu" or "cuda:0,cuda:1"
  bool dp_trace = false;              // --strategy dp: print each replica's shapes
  int64_t micro_batches = 4;          // --strategy pipeline: micro-batches per batch
  Schedule schedule = Schedule::k1F1B;  // --strategy pipeline
  int64_t virtual_stages = 0;         // --schedule interleaved: chunks per device (0: 2 if interleaved, else 1)
  std::string pipeline_split;         // --strategy pipeline: layer names that begin stages 2..S
  PipelineBalance pipeline_balance = PipelineBalance::kTime;  // --strategy pipeline without a split
  bool sync_bn = false;               // BatchNorm over the global batch (SyncBatchNorm)
  bool shard_optimizer = false;       // SGD's momentum sharded over the ranks (optim/zero.h)
  bool sequence_parallel = false;     // --mesh with tp: norms and residuals on 1/tp of the sequence
  FsdpSharding fsdp_sharding = FsdpSharding::kFull;  // --strategy fsdp (parallel/fsdp.h)
  int64_t fsdp_min_unit_params = int64_t(1) << 17;  // --strategy fsdp: the smallest unit (plan_units)
  DdpCommHook ddp_comm_hook = DdpCommHook::kAllReduce;  // parallel/comm_hook.h
  double bucket_cap_mb = 25;          // DDP bucket cap (the first bucket is 1 MiB)
  DistBackend dist_backend = DistBackend::kAuto;
  double dist_timeout = 300;          // seconds any collective may wait
  std::string nproc_per_node = "0";   // CLI: N > 0 or auto launches local workers of itself; a
                                      // list (1,2,4) runs it once per count (a scaling sweep)
  int64_t max_restarts = 0;           // CLI, with --nproc-per-node N: restarts of all the workers
                                      // after a failure (launch::LaunchOptions::max_restarts)
  bool count_memory = false;          // CLI: each rank's tensors counted (engine::CountingAllocator)
  bool skip_resource_check = false;   // CLI, with --nproc-per-node N: start the workers without
                                      // measuring their memory (Note [worker footprint])
  std::string device = "cpu";  // cpu | cuda | cuda:N: where each rank runs
  uint64_t seed = 0;           // the model's initialisation, the data's order, dropout's masks
};

// Checkpointing: where the run's state goes and whence it resumes.
struct CheckpointSection {
  std::string checkpoint_dir;   // empty: no checkpoints
  int64_t checkpoint_every = 0; // also save every N steps (0: at epoch ends only)
  // auto (sharded when the job has several ranks), file (rank 0 writes one
  // file), sharded (every rank writes its pieces: Note [sharded checkpoints])
  CheckpointFormat checkpoint_format = CheckpointFormat::kAuto;
  bool resume = false;          // continue from the newest checkpoint in checkpoint_dir
  std::string export_weights;   // safetensors file with the final weights
  std::string export_hf;        // a language model's final weights as a transformers folder (checkpoint/hf_format.h)
  double export_hf_shard_gb = 5;  // its largest shard (transformers' max_shard_size "5GB")
};

// Logging: what the run reports, and where.
struct LogSection {
  std::string metrics_out;      // JSON lines, one per epoch
  std::string config;           // --config: the TOML job file the flags came from (the CLI's)
  // The flags as a job file (the CLI's config_text), written beside
  // --metrics-out and in --checkpoint-dir once the run has started; empty:
  // not written (the library's own callers).
  std::string effective_config;
  std::string tensorboard;      // folder of TensorBoard event files (observe/tensorboard.h); rank 0
  int64_t log_every = 10;       // steps between the progress line's and TensorBoard's step records
  std::string profile_out;      // Chrome trace of --profile-steps (observe/profile.h); "{rank}": per rank
  std::string profile_steps = "5:8";  // A:B, the steps traced
  ProgressMode progress = ProgressMode::kAuto;
  double peak_tflops = 0;  // the device's peak for MFU (0: known for H100 and H200, else no MFU)
};

struct TrainOptions : DataSection, ModelSection, OptimSection, ParallelSection, CheckpointSection, LogSection {};

// Each section's own checks: values in range, and the section's flags that
// go together. Each throws tandem::UsageError naming the flags.
void check_section(const DataSection& data);
void check_section(const ModelSection& model);
void check_section(const OptimSection& optim);
void check_section(const ParallelSection& parallel);
void check_section(const CheckpointSection& checkpoint);
void check_section(const LogSection& log);

}  // namespace tandem::engine

namespace tandem::engine {

// --optimizer with auto resolved by the model's kind.
Optimizer resolved_optimizer(const TrainOptions& options);

// --seq-len with its default resolved: 0 for an image model; for a language
// model the given length, or the model's context, at most 1024.
int64_t resolved_seq_len(const TrainOptions& options);

// --virtual-stages with its default resolved: the model pieces each
// pipeline stage runs (2 under --schedule interleaved, else 1).
int64_t resolved_virtual_stages(const ParallelSection& options);

// The checks of a TrainOptions that need nothing but the options: values in
// range, flags that go together. Each throws tandem::UsageError naming the
// flags (the CLI exits 2). The Trainer runs them first; `tandem train
// --nproc-per-node N` runs them, and check_train_ranks for N, once before any
// worker starts, so that a mistake is named once and not by every worker.
void check_train_options(const TrainOptions& options);

// Those that need the number of processes in the job too (1: one process):
// a strategy of one process, the batch divided among the ranks.
void check_train_ranks(const TrainOptions& options, int64_t ranks);

// The output files rank `rank` will write (--metrics-out on rank 0,
// --export-weights, --profile-out): each must be a file its folder lets this
// process write, and the two written whole and renamed into place must not
// be devices or FIFOs. Throws tandem::Error naming the flag (the machine's
// files, not the command line: exit 1). `tandem train --nproc-per-node N`
// runs it for rank 0 before any worker starts; in a worker the same checks
// run where each file's writer is made (Trainer::run, MetricsWriter,
// StepProfiler).
void check_train_outputs(const TrainOptions& options, int64_t rank);

}  // namespace tandem::engine
