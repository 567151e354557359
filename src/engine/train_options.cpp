// The checks of TrainOptions that need no data, model or process group
// (train_options.h): what the command line alone shows to be wrong.
#include "tandem/engine/train_options.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/data/augment.h"
#include "tandem/data/source.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/checkpoint/hf_format.h"
#include "tandem/models/registry.h"
#include "tandem/observe/profile.h"
#include "tandem/observe/tensorboard.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/parallel/tensor_parallel_plan.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/parse.h"
#include "train_options_checks.h"

namespace tandem::engine {

namespace {

// The model's top-level layer names as the command line alone determines
// them (built on the CPU with a stand-in input), for the checks of flags
// that name or count layers before any data is read; nullopt where they
// depend on the data (a ResNet's automatic stem over IDX images of a size
// only the files say). A factory's refusal of an explicit --image-size is
// a usage error here.
std::optional<std::vector<std::string>> layers_before_data(const TrainOptions& o) {
  const bool wanted = o.image_size > 0 || o.checkpoint_activations > 0 || !o.pipeline_split.empty() ||
                      pipelined(o);
  if (!wanted) return std::nullopt;
  // A language model's layers follow from its preset alone (built, the
  // larger ones would take gigabytes for a list of names).
  if (auto traits = models::model_traits(o.model); traits.kind == models::ModelKind::kLanguageModel) {
    return traits.layer_names;
  }
  const std::string format = data::data_format(o.data);
  int64_t size = o.image_size;
  if (size == 0) {
    size = o.data == "fashion-mnist" ? 28 : format == "imagefolder" ? 224 : format == "idx" ? 0 : 32;
  }
  const bool size_matters = o.model.rfind("resnet", 0) == 0 && o.stem == "auto";
  if (size == 0 && size_matters) return std::nullopt;
  models::ModelOptions m;
  m.in_channels = format == "idx" ? 1 : 3;
  m.image_size = size > 0 ? size : 28;
  m.width_mult = o.width_mult;
  m.stem = o.stem;
  models::Sequence model{nullptr};
  try {
    torch::NoGradGuard no_grad;
    model = models::make_model(o.model, m);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    // The same words as the trainer's, after the data (trainer_setup.cpp).
    if (o.image_size > 0) {
      throw UsageError(detail::str_cat("--model ", o.model, ": ", e.what(), " (the images are ", o.image_size,
                                       " x ", o.image_size, ", from --image-size)"));
    }
    return std::nullopt;  // the data's own size decides: the trainer says it
  }
  std::vector<std::string> names;
  for (size_t i = 0; i < model->size(); ++i) names.push_back(model->name(i));
  return names;
}

}  // namespace

MeshFlag::MeshFlag(std::string text) : text_(std::move(text)) {
  if (!text_.empty() && !is_auto()) shape_ = dist::parse_mesh(text_, 0);
}

dist::MeshShape MeshFlag::for_ranks(int64_t ranks) const {
  dist::check_mesh_size(shape_, text_, ranks);
  return shape_;
}

std::ostream& operator<<(std::ostream& out, const MeshFlag& mesh) { return out << mesh.text(); }

namespace {

void one_of(const char* flag, const std::string& value, const std::vector<std::string>& names) {
  std::string known;
  for (const auto& name : names) known += (known.empty() ? "" : ", ") + name;
  TANDEM_CHECK_USAGE(std::find(names.begin(), names.end(), value) != names.end(), flag, ": expected one of ", known,
                     ", got '", value, "'");
}

}  // namespace

void check_section(const DataSection& o) {
  data::data_format(o.data);  // an unknown kind of data spec: a usage error
  if (!o.val_data.empty()) data::data_format(o.val_data);
  if (!o.augment.empty()) one_of("--augment", o.augment, data::augment_names());
  TANDEM_CHECK_USAGE(o.image_size >= 0 && o.image_size <= data::kMaxImageSize, "--image-size: expected 1 to ",
                     data::kMaxImageSize, " pixels (0: the format's default), got ", o.image_size);
  TANDEM_CHECK_USAGE(o.workers >= 0 && o.workers <= 1024, "--workers: expected 0 to 1024, got ", o.workers);
}

void check_section(const ModelSection& o) {
  models::resolve_model_name(o.model);  // "hf:DIR": its config.json's mistakes are usage errors
  one_of("--model", o.model, models::model_names());
  TANDEM_CHECK_USAGE(o.width_mult == 1 || o.model == "mobilenetv2", "--width-mult ", o.width_mult,
                     " applies to --model mobilenetv2 only, not ", o.model);
  TANDEM_CHECK_USAGE(o.stem == "auto" || o.model.rfind("resnet", 0) == 0, "--stem ", o.stem,
                     " applies to the resnet models only, not ", o.model);
  TANDEM_CHECK_USAGE(o.init_weights_except.empty() || !o.init_weights.empty(),
                     "--init-weights-except goes with --init-weights");
  try {
    checkpoint::check_weight_files(o.init_weights);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    TANDEM_CHECK_USAGE(false, "--init-weights ", o.init_weights, ": ", e.what());
  }
  TANDEM_CHECK_USAGE(o.amp == AmpMode::kOff || o.dtype == Dtype::kFloat32, "--amp ", o.amp,
                     " needs --dtype float32 (autocast lowers float32 ops), got --dtype ", o.dtype);
}

void check_section(const OptimSection& o) {
  TANDEM_CHECK_USAGE(o.epochs > 0, "--epochs: expected a positive integer, got ", o.epochs);
  TANDEM_CHECK_USAGE(o.batch_size > 0, "--batch-size: expected a positive integer, got ", o.batch_size);
  TANDEM_CHECK_USAGE(o.batch_per_process >= 0, "--batch-per-process: expected >= 0 (0: use --batch-size), got ",
                     o.batch_per_process);
  TANDEM_CHECK_USAGE(o.lr > 0, "--lr: expected a positive number, got ", o.lr);
  TANDEM_CHECK_USAGE(o.momentum >= 0 && o.momentum < 1, "--momentum: expected [0, 1), got ", o.momentum);
  TANDEM_CHECK_USAGE(!o.nesterov || o.momentum > 0, "--nesterov needs --momentum > 0");
  TANDEM_CHECK_USAGE(o.weight_decay >= 0, "--weight-decay: expected >= 0, got ", o.weight_decay);
  TANDEM_CHECK_USAGE(o.min_lr >= 0 && o.min_lr <= o.lr, "--min-lr ", o.min_lr, ": expected 0 to --lr (", o.lr,
                     "), where the cosine schedule ends; --lr is its peak");
  TANDEM_CHECK_USAGE(o.label_smoothing >= 0 && o.label_smoothing < 1,
                     "--label-smoothing: expected [0, 1), got ", o.label_smoothing);
  TANDEM_CHECK_USAGE(o.warmup_epochs >= 0 && o.warmup_epochs < o.epochs,
                     "--warmup-epochs: expected [0, --epochs), got ", o.warmup_epochs);
  TANDEM_CHECK_USAGE(o.max_steps >= 0, "--max-steps: expected >= 0, got ", o.max_steps);
  TANDEM_CHECK_USAGE(o.grad_accum >= 1, "--grad-accum: expected a positive integer, got ", o.grad_accum);
  TANDEM_CHECK_USAGE(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0,
                     "--clip-grad-norm: expected a finite number >= 0 (0: off), got ", o.clip_grad_norm);
  TANDEM_CHECK_USAGE(o.checkpoint_activations >= 0, "--checkpoint-activations: expected a number of segments "
                     ">= 0 (0: off), got ", o.checkpoint_activations);
}

void check_section(const ParallelSection& o) {
  const bool fsdp = o.strategy == Strategy::kFsdp;
  const bool pipeline = pipelined(o);  // --strategy pipeline or a --mesh with pp > 1
  const bool dp = o.strategy == Strategy::kDp;
  TANDEM_CHECK_USAGE(dp || pipeline || o.devices.empty(), "--devices goes with --strategy dp or pipeline");
  TANDEM_CHECK_USAGE(dp || !o.dp_trace, "--dp-trace goes with --strategy dp");
  TANDEM_CHECK_USAGE(!dp || !o.devices.empty(), "--strategy ", o.strategy,
                     " needs --devices (e.g. cpu,cpu or cuda:0,cuda:1)");
  if (!o.devices.empty()) parallel::parse_device_names(o.devices);  // whether the machine has them: later
  const ParallelSection defaults;  // a pipeline flag changed without --strategy pipeline is a mistake
  TANDEM_CHECK_USAGE(pipeline || (o.micro_batches == defaults.micro_batches && o.schedule == defaults.schedule &&
                                  o.virtual_stages == defaults.virtual_stages &&
                                  o.pipeline_split == defaults.pipeline_split &&
                                  o.pipeline_balance == defaults.pipeline_balance),
                     "--micro-batches, --schedule, --virtual-stages, --pipeline-split and "
                     "--pipeline-balance go with --strategy pipeline");
  TANDEM_CHECK_USAGE(o.virtual_stages >= 0, "--virtual-stages: expected a positive integer, got ",
                     o.virtual_stages);
  TANDEM_CHECK_USAGE(o.virtual_stages <= 1 || o.schedule == Schedule::kInterleaved, "--virtual-stages ",
                     o.virtual_stages, ": more than one chunk per device needs --schedule interleaved, not ",
                     o.schedule);
  TANDEM_CHECK_USAGE(fsdp || (o.fsdp_sharding == defaults.fsdp_sharding &&
                              o.fsdp_min_unit_params == defaults.fsdp_min_unit_params),
                     "--fsdp-sharding and --fsdp-min-unit-params go with --strategy fsdp");
  TANDEM_CHECK_USAGE(o.fsdp_min_unit_params >= 0, "--fsdp-min-unit-params: expected >= 0, got ",
                     o.fsdp_min_unit_params);
  TANDEM_CHECK_USAGE(!fsdp || (o.ddp_comm_hook == defaults.ddp_comm_hook && o.bucket_cap_mb == defaults.bucket_cap_mb),
                     "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets; --strategy fsdp reduces "
                     "each unit's gradients in one reduce-scatter");
  // They were accepted and ignored with allreduce (weights bit for bit
  // those of plain allreduce, exit 0).
  TANDEM_CHECK_USAGE(o.strategy == Strategy::kAuto || o.strategy == Strategy::kDdp ||
                         (o.ddp_comm_hook == defaults.ddp_comm_hook && o.bucket_cap_mb == defaults.bucket_cap_mb),
                     "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets (--strategy ddp, or auto over "
                     "several processes); --strategy ", o.strategy, " has none");
  TANDEM_CHECK_USAGE(o.micro_batches >= 1, "--micro-batches: expected a positive integer, got ", o.micro_batches);
  // An explicit split leaves nothing to balance (the flag was ignored).
  TANDEM_CHECK_USAGE(o.pipeline_split.empty() || o.pipeline_balance == defaults.pipeline_balance,
                     "--pipeline-balance ", o.pipeline_balance, " chooses the stages when --pipeline-split does "
                     "not; give one or the other");
  TANDEM_CHECK_USAGE(o.dist_timeout > 0 && o.dist_timeout <= 604800,
                     "--dist-timeout: expected a positive number of seconds up to a week (604800), got ",
                     o.dist_timeout);
  TANDEM_CHECK_USAGE(o.bucket_cap_mb > 0 && o.bucket_cap_mb <= 1e6,
                     "--bucket-cap-mb: expected a positive size up to 1e6 MiB, got ", o.bucket_cap_mb);
  TANDEM_CHECK_USAGE(!o.shard_optimizer || !fsdp, "--shard-optimizer does not go with --strategy fsdp, "
                     "which shards the momentum already (with the parameters and gradients)");
  // A mesh's pipeline stages replicated over dp ranks (Note [replicated
  // stages]): those ranks may shard the momentum and share BatchNorm's
  // statistics, as data-parallel ranks do.
  const bool replicated = pipeline && o.mesh[dist::MeshDim::kData] > 1;
  const std::string what = pipeline ? "a pipeline without dp ranks (--mesh pp=P,dp=D replicates its stages)"
                                    : "--strategy " + strategy_name(o.strategy);
  TANDEM_CHECK_USAGE(!o.shard_optimizer || (!dp && (!pipeline || replicated) && o.strategy != Strategy::kNone),
                     "--shard-optimizer shards the optimizer state over data-parallel ranks (--strategy "
                     "auto, ddp or allreduce); it does not work with ", what);
  TANDEM_CHECK_USAGE(!o.sync_bn || (!dp && (!pipeline || replicated)),
                     "--sync-bn normalises BatchNorm over data-parallel ranks (--strategy auto, ddp, "
                     "allreduce or fsdp); it does not work with ", what, ", where ",
                     dp ? "each replica normalises its own share of the batch, as PyTorch's DataParallel does"
                        : "each micro-batch is normalised on its own",
                     ": leave out --sync-bn");
}

void check_section(const CheckpointSection& o) {
  TANDEM_CHECK_USAGE(!o.resume || !o.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  TANDEM_CHECK_USAGE(o.checkpoint_format == CheckpointFormat::kAuto || !o.checkpoint_dir.empty(), "--checkpoint-format ",
                     o.checkpoint_format, " needs --checkpoint-dir (where the checkpoints go)");
  TANDEM_CHECK_USAGE(o.checkpoint_every >= 0, "--checkpoint-every: expected >= 0 (0: epoch ends only), got ",
                     o.checkpoint_every);
  TANDEM_CHECK_USAGE(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(),
                     "--checkpoint-every needs --checkpoint-dir (where the checkpoints go)");
}

void check_section(const LogSection& o) {
  TANDEM_CHECK_USAGE(o.log_every >= 1, "--log-every: expected a whole number >= 1, got ", o.log_every);
  // Metrics are the job's (summed over the ranks, written by rank 0): a
  // per-rank name would have been taken literally.
  TANDEM_CHECK_USAGE(o.metrics_out.find("{rank}") == std::string::npos, "--metrics-out ", o.metrics_out,
                     ": one file for the job (rank 0 writes the figures summed over the ranks); {rank} applies to "
                     "--export-weights and --profile-out");
  as_usage_error([&] { return observe::parse_profile_steps(o.profile_steps); });
  TANDEM_CHECK_USAGE(!o.profile_out.empty() || o.profile_steps == LogSection{}.profile_steps,
                     "--profile-steps goes with --profile-out");
}

// Note [option sections]: each section's own checks, then those across them.
void check_train_options(const TrainOptions& o) {
  check_section(static_cast<const ModelSection&>(o));
  check_section(static_cast<const DataSection&>(o));
  internal::check_optimizer(o);  // an SGD flag with AdamW is named as such, before SGD's own checks
  check_section(static_cast<const OptimSection&>(o));
  {
    // The optimizer computes in the parameters' dtype: a rate libtorch cannot
    // convert to it fails inside SGD with a message that names no flag.
    const bool doubles = o.dtype == Dtype::kFloat64;
    const double largest = doubles ? std::numeric_limits<double>::max() : std::numeric_limits<float>::max();
    for (const auto& [flag, value] : {std::pair<const char*, double>{"--lr", o.lr},
                                      {"--weight-decay", o.weight_decay},
                                      {"--clip-grad-norm", o.clip_grad_norm}}) {
      TANDEM_CHECK_USAGE(value <= largest, flag, " ", value, ": beyond the largest ",
                         doubles ? "float64" : "float32", " (", largest, "), the parameters' dtype");
    }
  }
  internal::check_model_and_data(o);
  check_section(static_cast<const ParallelSection&>(o));
  check_section(static_cast<const CheckpointSection&>(o));
  check_section(static_cast<const LogSection&>(o));
  {
    // Two output flags on one file: the last writer's would win and the
    // other's output be lost, with exit 0 (a sweep's find: metrics lines
    // gone under the weights). Paths compared as absolute, normalised
    // names, and as the same file where both exist (a link, a second name).
    namespace fs = std::filesystem;
    const std::vector<std::pair<const char*, std::string>> outputs{
        {"--metrics-out", o.metrics_out}, {"--export-weights", o.export_weights}, {"--profile-out", o.profile_out}};
    for (size_t i = 0; i < outputs.size(); ++i) {
      for (size_t j = i + 1; j < outputs.size(); ++j) {
        const auto& [flag_a, a] = outputs[i];
        const auto& [flag_b, b] = outputs[j];
        if (a.empty() || b.empty()) continue;
        std::error_code ec;
        const bool same = fs::absolute(a, ec).lexically_normal() == fs::absolute(b, ec).lexically_normal() ||
                          fs::equivalent(a, b, ec);
        TANDEM_CHECK_USAGE(!same, flag_a, " ", a, " and ", flag_b, " ", b,
                           " name the same file: each needs its own");
      }
    }
  }

  const bool fsdp = o.strategy == Strategy::kFsdp;
  const bool pipeline = pipelined(o);
  const bool dp = o.strategy == Strategy::kDp;
  TANDEM_CHECK_USAGE(!pipeline || o.grad_accum == 1, "--grad-accum does not go with a pipeline (",
                     o.strategy == Strategy::kPipeline ? "--strategy pipeline" : "--mesh " + o.mesh.text(),
                     "): it already passes each batch in --micro-batches chunks and accumulates their "
                     "gradients (raise --micro-batches instead)");
  if (o.checkpoint_activations > 0) {
    TANDEM_CHECK_USAGE(!pipeline || o.checkpoint_activations == 1, "--checkpoint-activations ",
                       o.checkpoint_activations, ": with --strategy pipeline every stage is recomputed whole "
                       "(GPipe's re-materialization); give --checkpoint-activations 1");
    TANDEM_CHECK_USAGE(!o.sync_bn, "--checkpoint-activations does not go with --sync-bn: the recomputed "
                       "forward would reduce BatchNorm statistics over the ranks again, out of step with "
                       "backward's gradient reductions");
    TANDEM_CHECK_USAGE(!o.cuda_graph, "--checkpoint-activations does not go with --cuda-graph (a backward "
                       "inside the backward is not captured)");
    TANDEM_CHECK_USAGE(!fsdp || o.checkpoint_activations == 1, "--checkpoint-activations ",
                       o.checkpoint_activations, ": with --strategy fsdp every unit but the last is recomputed "
                       "whole (Note [fsdp activation checkpointing]); give --checkpoint-activations 1");
  }
  const bool cuda = o.device.rfind("cuda", 0) == 0;  // the device itself: parse_device
  TANDEM_CHECK_USAGE(!o.cudnn_benchmark || cuda, "--cudnn-benchmark needs --device cuda (cuDNN "
                     "runs only on CUDA devices), got --device ", o.device);
  TANDEM_CHECK_USAGE(!o.cuda_graph || cuda, "--cuda-graph needs --device cuda (a CUDA graph "
                     "replays GPU kernels), got --device ", o.device);
  TANDEM_CHECK_USAGE(!o.cuda_graph || (!dp && !pipeline && !fsdp),
                     "--cuda-graph captures the step of one process on one device; it does not work with "
                     "--strategy ", o.strategy);
  TANDEM_CHECK_USAGE(!o.cuda_graph || !o.shard_optimizer, "--cuda-graph runs one rank, whose optimizer "
                     "state has nothing to be sharded over; leave out --shard-optimizer");
  TANDEM_CHECK_USAGE(!o.cuda_graph || o.dropout == 0, "--cuda-graph replays one captured step, and --dropout "
                     "draws each step's masks from that step's seed (Note [dropout seeds]), which a replay does "
                     "not set; leave out one of them");
  TANDEM_CHECK_USAGE(!o.cuda_graph || o.grad_accum == 1, "--cuda-graph captures a step of one forward and "
                     "backward; it does not work with --grad-accum ", o.grad_accum);
  TANDEM_CHECK_USAGE(!o.cuda_graph || o.amp != AmpMode::kFp16, "--cuda-graph does not work with --amp fp16: the "
                     "loss scaler decides on the host whether to take each step; use --amp bf16");
  // Flags that name or count the model's layers, in the trainer's words.
  if (auto layers = layers_before_data(o)) {
    const auto count = static_cast<int64_t>(layers->size());
    TANDEM_CHECK_USAGE(o.checkpoint_activations <= count, "--checkpoint-activations ", o.checkpoint_activations,
                       ": ", o.model, " has ", count, " top-level layers to cut into segments");
    std::string known;
    for (const auto& name : *layers) known += (known.empty() ? "" : ", ") + name;
    for (const auto& name : split(o.pipeline_split, ',')) {
      if (name.empty()) continue;
      TANDEM_CHECK_USAGE(std::find(layers->begin(), layers->end(), name) != layers->end(),
                         "--pipeline-split: no layer '", name, "' in the model (its layers: ", known, ")");
    }
    if (pipeline && !o.devices.empty() && o.pipeline_split.empty()) {
      const auto stages = static_cast<int64_t>(split(o.devices, ',').size());
      const int64_t chunks = resolved_virtual_stages(o);
      TANDEM_CHECK_USAGE(count >= stages * chunks, "pipeline: the model has ", count, " layers, fewer than the ",
                         stages * chunks, " stages (", stages, " devices", chunks > 1 ? " x --virtual-stages " : "",
                         chunks > 1 ? std::to_string(chunks) : std::string(), ")");
    }
  }
}

int64_t resolved_virtual_stages(const ParallelSection& o) {
  return o.virtual_stages > 0 ? o.virtual_stages : o.schedule == Schedule::kInterleaved ? 2 : 1;
}

void check_train_ranks(const TrainOptions& o, int64_t ranks) {
  const auto layout = parallel_layout(o, ranks);
  const bool pipeline = layout.pipeline;
  TANDEM_CHECK_USAGE(ranks == 1 || o.strategy != Strategy::kDp, "--strategy ", o.strategy,
                     " runs in one process over --devices, not over a job of ", ranks,
                     " processes; for several processes use --strategy ddp");
  if (pipeline && ranks > 1) {
    TANDEM_CHECK_USAGE(o.devices.empty(), "--devices ", o.devices, ": --strategy pipeline over ", ranks,
                       " ranks runs one stage per rank, on its --device (cpu, or cuda:LOCAL_RANK); "
                       "leave out --devices");
  } else {
    TANDEM_CHECK_USAGE(!pipeline || !o.devices.empty(), "--strategy pipeline needs --devices (e.g. cpu,cpu "
                       "or cuda:0,cuda:1), or several ranks (--nproc-per-node N: one stage per rank)");
  }
  TANDEM_CHECK_USAGE(ranks == 1 || o.strategy != Strategy::kNone, "--strategy none runs one process, not a job of ",
                     ranks, " processes; a job of several ranks needs a data-parallel strategy");
  TANDEM_CHECK_USAGE(ranks == 1 || !o.cuda_graph, "--cuda-graph captures the step of one process on one "
                     "device; it does not work in a job of ", ranks, " processes");
  // A pipeline's ranks are its stages and their replicas: the replicas share
  // the batch, and every stage of one reads all of its share.
  // So do a tp group's ranks: each reads its replica's share.
  const bool tensor = layout.tensor_ranks() > 1;
  TANDEM_CHECK_USAGE(!o.sequence_parallel || tensor, "--sequence-parallel splits the sequence over the tensor-parallel "
                     "ranks; give --mesh with tp > 1 (e.g. --mesh tp=2)");
  if (tensor) {  // named once here rather than by every worker (TensorParallelPlan's own words)
    const int64_t tp = layout.tensor_ranks();
    for (const auto& [what, size] : models::model_traits(o.model).tensor_parallel_divisors) {
      try {
        parallel::check_divides_heads(size, what, tp);
      } catch (const Error& e) {
        throw UsageError("--mesh " + o.mesh.text() + ": " + e.what());
      }
    }
  }
  const int64_t cp = layout.context_ranks();
  check_context_seq_len(o.seq_len, cp, o.mesh.text());  // named once here rather than by every worker
  // A cp group's ranks read the same samples: the data see dp = data_ranks / cp.
  const int64_t world = pipeline || tensor || cp > 1 ? layout.data_ranks() / cp : ranks;
  TANDEM_CHECK_USAGE(o.batch_per_process <= std::numeric_limits<int64_t>::max() / world,
                     "--batch-per-process ", o.batch_per_process, ": too large for ", world, " ranks");
  const int64_t batch = o.batch_per_process > 0 ? o.batch_per_process * world : o.batch_size;
  const std::string divisor = layout.replicated_stages() || (pipeline && ranks > 1) || tensor || cp > 1
                                  ? detail::str_cat("the ", world, " data-parallel rank(s) of --mesh ",
                                                    layout.mesh.str())
                                  : detail::str_cat("the world size ", world);
  TANDEM_CHECK_USAGE(batch % world == 0, "--batch-size ", batch, ": not divisible by ", divisor,
                     " (each data-parallel rank takes batch-size / ", world, " samples a step)");
  // What set each rank's share: the flag the user gave.
  const std::string share = o.batch_per_process > 0
                                ? detail::str_cat("--batch-per-process ", o.batch_per_process)
                                : detail::str_cat("--batch-size ", batch, " over ", world, " data-parallel rank(s)");
  TANDEM_CHECK_USAGE(o.grad_accum <= batch / world, "--grad-accum ", o.grad_accum, ": more chunks than the ",
                     batch / world, " samples each rank takes a step (", share, ")");
  TANDEM_CHECK_USAGE(!pipeline || o.micro_batches <= batch / world, "--micro-batches ", o.micro_batches,
                     ": more than the ", batch / world, " samples each rank takes a step (", share,
                     "); each micro-batch needs at least one");
  // A pipeline over ranks: the model must cut into its stages, named once
  // here rather than by every worker.
  if (pipeline && o.devices.empty() && layout.pipeline_ranks() > 1) {
    const int64_t stages = layout.pipeline_ranks();
    const int64_t chunks = resolved_virtual_stages(o);
    const std::string ranks_flag = o.mesh.empty() ? detail::str_cat("--nproc-per-node ", ranks)
                                                  : "--mesh " + o.mesh.text();
    if (!o.pipeline_split.empty()) {
      int64_t names = 1;
      for (char c : o.pipeline_split) names += c == ',' ? 1 : 0;
      TANDEM_CHECK_USAGE(names + 1 == stages * chunks, "--pipeline-split ", o.pipeline_split, ": ", names,
                         " name(s) begin ", names + 1, " pieces, but ", ranks_flag, " runs ", stages, " stages",
                         chunks > 1 ? detail::str_cat(" x --virtual-stages ", chunks) : std::string(),
                         ": give ", stages * chunks - 1, " layer name(s)");
    } else if (auto layers = layers_before_data(o)) {
      const auto count = static_cast<int64_t>(layers->size());
      TANDEM_CHECK_USAGE(count >= stages * chunks, "pipeline: ", o.model, " has ", count, " layers, fewer than the ",
                         stages * chunks, " pieces of ", ranks_flag, " (", stages, " stages",
                         chunks > 1 ? detail::str_cat(" x --virtual-stages ", chunks) : std::string(), ")");
    }
  }
}

void check_train_outputs(const TrainOptions& o, int64_t rank) {
  if (rank == 0 && !o.metrics_out.empty()) check_output_file("--metrics-out", o.metrics_out);
  if (rank == 0 && !o.tensorboard.empty()) check_output_folder("--tensorboard", o.tensorboard);
  if (rank == 0 && !o.export_hf.empty()) check_output_folder("--export-hf", o.export_hf);
  for (const auto& [flag, pattern] : {std::pair<const char*, std::string>{"--export-weights", o.export_weights},
                                      {"--profile-out", o.profile_out}}) {
    const std::string path = rank_output_path(pattern, rank);
    if (path.empty()) continue;
    check_output_file(flag, path);
    check_replaceable_file(flag, path);
  }
}

}  // namespace tandem::engine
