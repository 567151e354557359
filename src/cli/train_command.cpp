// tandem train: flags -> TrainOptions -> Trainer -> summary table.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <thread>

#include <torch/cuda.h>

#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "auto_mesh.h"
#include "common_flags.h"
#include "config_file.h"
#include "train_sweep.h"
#include "tandem/data/augment.h"
#include "tandem/data/source.h"
#include "tandem/dist/device_mesh.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/counting_allocator.h"
#include "tandem/engine/trainer.h"
#include "tandem/engine/worker_footprint.h"
#include "tandem/launch/launcher.h"
#include "tandem/models/registry.h"
#include "tandem/observe/metrics.h"
#include "tandem/util/env.h"
#include "tandem/util/parse.h"
#include "tandem/util/stats.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

// The flag table; defaults are those of engine::TrainOptions.
FlagSet train_flags(engine::TrainOptions& o) {
  FlagSet flags("tandem train",
                "Train a model on one device or many (--nproc-per-node, --strategy) and "
                "evaluate it after every epoch.");
  add_data_flags(flags, o);
  add_model_flags(flags, o);
  flags.add_string("init-weights", "FILE", &o.init_weights,
                   "start from the weights in this safetensors file (what --export-weights "
                   "writes; torchvision's state_dict names for resnet and mobilenetv2; for a language "
                   "model also transformers' save_pretrained folder or model.safetensors) instead of "
                   "a random initialisation; every parameter and buffer must be there");
  flags.add_string("init-weights-except", "NAMES", &o.init_weights_except,
                   "with --init-weights: modules or tensors (comma-separated, e.g. fc or "
                   "classifier) left at their random initialisation and ignored in the file, "
                   "such as a head for another number of classes");
  flags.add_switch("cuda-graph", &o.cuda_graph,
                   "capture the training step (forward, backward, SGD) as a CUDA graph after 3 "
                   "eager steps and replay it (one process, one CUDA device; not with --amp fp16)");

  flags.section("optimisation");
  flags.add_int("epochs", "N", &o.epochs, "passes over the training data", 1);
  flags.add_int("batch-size", "N", &o.batch_size, "global batch size", 1);
  flags.add_int("batch-per-process", "N", &o.batch_per_process,
                "instead of --batch-size: each data-parallel rank's batch, the global one being N times "
                "the number of processes (the dp size of --mesh; as a DDP script's per-process batch; 0: "
                "use --batch-size)", 0);
  flags.add_enum("optimizer", &o.optimizer, engine::optimizer_names(),
                 "auto: adamw for the language models, sgd for the image models; sgd (momentum, "
                 "--nesterov, L2 --weight-decay) or adamw (--beta1, --beta2, --adam-eps, decoupled "
                 "--weight-decay of the matrices and embeddings only)");
  flags.add_double("lr", "X", &o.lr,
                   format("peak learning rate (shown: SGD's; AdamW's default is %g)", engine::kAdamWLr), 0, 1e300,
                   "a positive number up to 1e+300");  // 0 itself: check_train_options
  flags.add_double("min-lr", "X", &o.min_lr, "learning rate at the end of the cosine schedule", 0);
  flags.add_double("warmup-epochs", "X", &o.warmup_epochs, "linear warmup from 0 to --lr, in epochs (fractions allowed)", 0);
  flags.add_double("momentum", "X", &o.momentum, "SGD momentum", 0);
  flags.add_switch("nesterov", &o.nesterov, "use Nesterov momentum");
  flags.add_double("weight-decay", "X", &o.weight_decay,
                   format("weight decay (shown: SGD's; AdamW's default is %g)", engine::kAdamWWeightDecay), 0);
  flags.add_double("beta1", "X", &o.beta1, "AdamW's first-moment decay", 0);
  flags.add_double("beta2", "X", &o.beta2, "AdamW's second-moment decay (0.95: GPT-3's, nanoGPT's, llm.c's)", 0);
  flags.add_double("adam-eps", "X", &o.adam_eps, "AdamW's epsilon", 0);
  flags.add_double("label-smoothing", "X", &o.label_smoothing, "cross-entropy label smoothing", 0);
  flags.add_double("dropout", "P", &o.dropout,
                   "GPT-2's dropout (embeddings, attention probabilities, residuals, as transformers' three "
                   "pdrops) while training; under tp each rank keeps its part of one process's mask",
                   0, 1, "a probability from 0 up to, not including, 1");
  flags.add_int("max-steps", "N", &o.max_steps, "stop after N optimizer steps (0: no limit)", 0);
  flags.add_int("grad-accum", "K", &o.grad_accum,
                "gradient accumulation: pass each rank's batch forward and backward in K "
                "chunks, one after another, then step once (the whole batch's update in about "
                "1/K of the activation memory; BatchNorm normalises each chunk by its own "
                "statistics; with ddp only the last chunk's backward all-reduces)", 1);
  flags.add_int("checkpoint-activations", "N", &o.checkpoint_activations,
                "activation checkpointing: cut the model's top-level layers into N segments and "
                "keep no activations of the first N - 1, recomputing each in backward (less "
                "memory for one more forward of them; the same gradients); with --strategy "
                "pipeline, 1: every stage recomputes its micro-batches' forward (GPipe's "
                "re-materialization); with --strategy fsdp, 1: every unit but the last; 0: off", 0);
  flags.add_double("clip-grad-norm", "X", &o.clip_grad_norm,
                   "before each step, scale the gradients down so that their global 2-norm is "
                   "at most X (after averaging over the ranks and unscaling; 0: off)", 0);

  flags.section("distributed");
  flags.add_string("nproc-per-node", "N|auto|LIST", &o.nproc_per_node,
                   "launch N local worker processes of this command (tandem launch's short form); "
                   "auto: one per GPU with --device cuda, else min(4, cores) CPU workers; "
                   "0: run in this process; a list such as 1,2,4: a scaling sweep, the job run "
                   "once per count, then the scaling table of epoch time, speed-up and efficiency");
  flags.add_int("max-restarts", "K", &o.max_restarts,
                "with --nproc-per-node N: after a worker fails, restart all of them, up to K times; they "
                "resume from the newest checkpoint in --checkpoint-dir (tandem launch's --max-restarts)", 0);
  flags.add_switch("count-memory", &o.count_memory,
                   "on CPUs: count every tensor allocation of each rank and record the peak of its live bytes "
                   "over each epoch's training steps (--metrics-out's peak_memory_bytes, rank 0's; evaluation not "
                   "counted), what tandem plan predicts");
  flags.add_switch("skip-resource-check", &o.skip_resource_check,
                   "with --nproc-per-node N on CPUs: start the workers without first measuring what one needs "
                   "(this process opens the data and takes one step) and refusing a job the machine's memory "
                   "cannot hold");
  flags.add_enum("strategy", &o.strategy, engine::strategy_names(),
                   "how to use several devices; auto: ddp when there are several ranks "
                   "(bucketed all-reduce overlapping backward); allreduce: every gradient "
                   "all-reduced after backward, as a hand-written data-parallel loop does; fsdp: fully sharded data parallel "
                   "(ZeRO-3: each rank keeps 1/world of the parameters, gradients and momentum, "
                   "gathering one unit of layers at a time); dp: one process over --devices "
                   "(DataParallel); pipeline: the model cut into one stage per device of "
                   "--devices, micro-batches flowing through them (or, launched over N "
                   "processes, one stage per process on its --device)");
  flags.add_parsed("mesh", "DIMS", o.mesh.text(),
                   "the job's ranks as a grid of pipeline stages x data-parallel replicas x tensor-parallel "
                   "shards, e.g. dp=2,pp=2 or dp=2,tp=2 on 4 ranks (pp outermost, tp innermost; an omitted "
                   "dimension is 1; the product is the number of ranks): every stage replicated over its dp "
                   "ranks, --strategy ddp, allreduce or fsdp doing the dp dimension; tp splits a language "
                   "model's heads, features and vocabulary (with DDP, ZeRO-1 or FSDP over dp, a pipeline over pp; "
                   "see --sequence-parallel); dp_replicate=R,dp_shard=S in place of dp=R*S: HSDP, FSDP over "
                   "each group of S dp ranks and the R groups' gradients averaged (--strategy fsdp); cp=C: "
                   "context parallelism, each sequence of a language model cut over C ranks that read the same "
                   "samples, attention around their ring (composes with dp, pp and tp; --seq-len a multiple of "
                   "2C); ep=E: expert parallelism, a mixture of experts' experts spread over E of the dp x cp "
                   "ranks (which it borrows, adding none: dp=4,ep=2 is 4 ranks), tokens sent to their experts by "
                   "all-to-all; auto (with --nproc-per-node N): the layout tandem plan predicts "
                   "fastest among those that fit, printed before the first step and set beside the measured "
                   "figures after the last; default: pp=N under --strategy pipeline, else dp=N",
                   [&o](const std::string& value) { o.mesh = engine::MeshFlag(value); });
  flags.add_string("devices", "LIST", &o.devices,
                   "devices of --strategy dp or pipeline in one process, e.g. cpu,cpu or "
                   "cuda:0,cuda:1 (repeats allowed)");
  flags.add_switch("dp-trace", &o.dp_trace,
                   "--strategy dp: print each replica's input and output shapes and device");
  flags.add_int("micro-batches", "M", &o.micro_batches,
                "--strategy pipeline: micro-batches each batch is cut into", 1);
  flags.add_enum("schedule", &o.schedule, engine::schedule_names(),
                   "--strategy pipeline: gpipe (all forwards, then all backwards), 1f1b "
                   "(at most one micro-batch per later stage in flight; same bubble, less memory) "
                   "or interleaved (1F1B over --virtual-stages chunks per device, Megatron-LM's "
                   "schedule: a bubble about that many times smaller, for more hand-offs)");
  flags.add_int("virtual-stages", "V", &o.virtual_stages,
                "--schedule interleaved: the model is cut into devices x V pieces, device d "
                "running pieces d, d + devices, ... (0: 2 with --schedule interleaved, else 1)", 0);
  flags.add_string("pipeline-split", "NAMES", &o.pipeline_split,
                   "--strategy pipeline: the layers that begin stages 2, 3, ... (one stage per "
                   "device, or devices x --virtual-stages), e.g. conv2 (default: balanced, see "
                   "--pipeline-balance)");
  flags.add_enum("pipeline-balance", &o.pipeline_balance, engine::pipeline_balance_names(),
                   "--strategy pipeline without --pipeline-split: balance the stages by "
                   "measured forward+backward time or by parameter count");
  flags.add_switch("sync-bn", &o.sync_bn,
                   "BatchNorm over the whole global batch (SyncBatchNorm), so results do not "
                   "depend on the number of ranks; with data-parallel ranks (not dp or pipeline)");
  flags.add_switch("shard-optimizer", &o.shard_optimizer,
                   "ZeRO stage 1 (PyTorch's ZeroRedundancyOptimizer): each rank keeps SGD's "
                   "momentum for its share of the parameters only, steps that share and "
                   "broadcasts it (about 1/world of the optimizer memory, the same weights; "
                   "the parameters cross the network once more a step); with ddp or allreduce");
  flags.add_switch("sequence-parallel", &o.sequence_parallel,
                   "--mesh with tp > 1: between the tensor-parallel layers (norms, residuals, "
                   "positions) each tp rank holds 1/tp of the sequence, with an all-gather and a "
                   "reduce-scatter in place of each all-reduce (Megatron-LM's sequence parallelism: "
                   "the same traffic, 1/tp of those activations); --seq-len must be a multiple of tp");
  flags.add_enum("fsdp-sharding", &o.fsdp_sharding, engine::fsdp_sharding_names(),
                   "--strategy fsdp: full frees each unit's parameters after its forward and "
                   "gathers them again for its backward (ZeRO-3, PyTorch's FULL_SHARD); grad-op "
                   "keeps them from forward to backward (ZeRO-2, SHARD_GRAD_OP: one all-gather "
                   "less per unit, more memory)");
  flags.add_int("fsdp-min-unit-params", "N", &o.fsdp_min_unit_params,
                "--strategy fsdp: consecutive top-level layers are grouped into units of at "
                "least N parameters, gathered one at a time (0: every layer a unit)", 0);
  flags.add_enum("ddp-comm-hook", &o.ddp_comm_hook, engine::ddp_comm_hook_names(),
                   "how DDP reduces gradient buckets: allreduce in float32, or compressed to "
                   "fp16 / bf16 on the wire (half the bytes, rounded)");
  flags.add_double("bucket-cap-mb", "MB", &o.bucket_cap_mb,
                   "DDP gradient bucket size in MiB (between a first and a last bucket of 1 MiB)", 1e-3, 1e6);
  flags.add_enum("dist-backend", &o.dist_backend, engine::dist_backend_names(),
                   "collective backend; auto: nccl on CUDA, gloo on CPU");
  flags.add_double("dist-timeout", "SECONDS", &o.dist_timeout,
                   "longest wait of any collective before the job fails", 1e-3, 604800);

  flags.section("run");
  flags.add_string("config", "FILE", &o.config,
                   "a TOML job file of these flags by section ([data], [model], [optimisation], [distributed], "
                   "[run]); flags on the command line replace its. The run's effective configuration is written "
                   "beside --metrics-out (NAME.config.toml) and in --checkpoint-dir (config.toml)");
  flags.add_string("device", "DEV", &o.device, "cpu, cuda or cuda:N");
  flags.add_double("peak-tflops", "X", &o.peak_tflops,
                   "a device's peak TFLOPS (0.001 to 100000), for a language model's MFU (0: known for H100 "
                   "and H200, bf16 dense; otherwise no MFU)", 0, 1e5);
  flags.add_uint("seed", "N", &o.seed,
                 "seed for initialisation, shuffling and augmentation; as in PyTorch, the first two (libtorch's CPU generator) use only its low 32 bits");
  flags.add_string("checkpoint-dir", "DIR", &o.checkpoint_dir,
                   "save a checkpoint there after every epoch (atomic writes)");
  flags.add_int("checkpoint-every", "N", &o.checkpoint_every,
                "also save every N optimizer steps (0: epoch ends only)", 0);
  flags.add_enum("checkpoint-format", &o.checkpoint_format, engine::checkpoint_format_names(),
                   "sharded: every rank writes what it owns into a checkpoint-<step> folder with a manifest "
                   "(needs a --checkpoint-dir all nodes share); file: rank 0 gathers the state and writes one "
                   "file; auto: sharded when the job has several ranks");
  flags.add_switch("resume", &o.resume, "continue from the newest checkpoint in --checkpoint-dir");
  flags.add_string("metrics-out", "FILE", &o.metrics_out,
                   "write one JSON line per epoch (rank 0, the job's figures summed over the ranks)");
  flags.add_string("tensorboard", "DIR", &o.tensorboard,
                   "write TensorBoard event files there (rank 0): each epoch's --metrics-out figures, and "
                   "every --log-every steps the training loss, learning rate, samples per second, step "
                   "time and, with --amp fp16, the gradient scale");
  flags.add_int("log-every", "N", &o.log_every,
                "steps between the progress line's updates and TensorBoard's step records", 1);
  flags.add_string("export-hf", "DIR", &o.export_hf,
                   "a language model's final weights as a folder that transformers' "
                   "AutoModelForCausalLM.from_pretrained(DIR) loads (config.json, model.safetensors; past "
                   "--export-hf-shard-gb, shards under model.safetensors.index.json, as save_pretrained cuts them)");
  flags.add_double("export-hf-shard-gb", "X", &o.export_hf_shard_gb,
                   "--export-hf's largest shard in GB of 10^9 bytes (transformers' max_shard_size, 5GB)", 1e-6, 1e6);
  flags.add_string("export-weights", "FILE", &o.export_weights,
                   "write the final parameters and buffers as safetensors (rank 0; a "
                   "{rank} in FILE makes every rank write its own)");
  flags.add_string("profile-out", "FILE", &o.profile_out,
                   "write a Chrome trace (chrome://tracing, Perfetto) of the steps of "
                   "--profile-steps: every ATen operator and the trainer's phases (forward, "
                   "backward, reduce, optimizer, next_batch), from libtorch's profiler (rank 0; "
                   "a {rank} in FILE makes every rank write its own)");
  flags.add_string("profile-steps", "A:B", &o.profile_steps,
                   "with --profile-out: trace the optimizer steps from A up to B (not included), "
                   "counted from 0");
  flags.add_enum("progress", &o.progress, engine::progress_names(),
                   "live bar on a terminal (auto), plain lines, or nothing (warnings are printed whatever this is)");
  return flags;
}


// --nproc-per-node: N, or auto (GPUs for a CUDA device, else up to 4 CPU
// workers); 0 runs in this process.
int64_t local_workers(const engine::TrainOptions& o) {
  if (o.nproc_per_node == "auto") {
    if (o.device.rfind("cuda", 0) == 0) {
      auto gpus = static_cast<int64_t>(torch::cuda::device_count());
      if (gpus == 0) throw Error("--nproc-per-node auto --device " + o.device + ": no CUDA device here");
      return gpus;
    }
    return std::min<int64_t>(4, std::max<unsigned>(1, std::thread::hardware_concurrency()));
  }
  auto n = parse_int(o.nproc_per_node);
  if (!n || *n < 0 || *n > launch::kMaxLocalWorkers) {
    throw UsageError(format("--nproc-per-node: expected a number from 0 to %lld, auto or a list such as "
                            "1,2,4, got '",
                            static_cast<long long>(launch::kMaxLocalWorkers)) +
                     o.nproc_per_node + "'");
  }
  return *n;
}


// The devices table: what the run's devices, batches and epochs came to.
void print_devices_table(const engine::TrainOptions& o, const engine::TrainResult& r) {
  std::vector<double> seconds;
  for (const auto& m : r.epochs) {
    if (!m.partial) seconds.push_back(m.epoch_seconds);
  }
  if (seconds.empty() || r.epochs.empty()) return;
  size_t n = seconds.size();
  int64_t world = r.epochs.back().world_size;
  Table table({"devices", "global batch", "batch per process", "epoch time (s)", "test acc"});
  const auto& last = r.epochs.back();
  // A pipeline over ranks: every stage (process) of a replica passes its whole share.
  const auto layout = engine::parallel_layout(o, world);
  const bool stages = layout.pipeline && o.devices.empty();
  const std::string mesh = layout.data_ranks() > 1 ? ", mesh " + layout.mesh.str() : std::string();
  std::string devices = o.strategy == engine::Strategy::kDp ? o.devices + " (one process)"
                        : stages ? format("%lld x %s (pipeline, a stage each%s)", static_cast<long long>(world),
                                          o.device.c_str(), mesh.c_str())
                        : layout.pipeline ? o.devices + " (pipeline, one process)"
                                          : format("%lld x %s", static_cast<long long>(world), o.device.c_str());
  const int64_t shares = layout.pipeline ? layout.data_ranks() : world;
  table.add_row({devices,
                 std::to_string(o.batch_size), std::to_string(o.batch_size / shares),
                 format("%.1f", median(seconds)),
                 last.evaluated ? format("%.2f%%", 100 * last.test_acc) : "-"});
  std::printf("\n%s(epoch time: the median of %zu full epoch%s)\n", table.render().c_str(), n,
              n == 1 ? "" : "s");
}

// A language model's epochs: losses in nats per token, perplexity, bits
// per byte for text, tokens a second and MFU where the peak is known.
void print_language_summary(const engine::TrainOptions& o, const engine::TrainResult& r) {
  if (r.epochs.empty()) {  // resumed after its last step: nothing was left to train
    std::printf("\n%s on %s: no epoch left to train after step %lld\n", o.model.c_str(), o.data.c_str(),
                static_cast<long long>(r.steps));
    std::fflush(stdout);
    return;
  }
  const bool text = r.epochs.back().text;
  const bool mfu = std::any_of(r.epochs.begin(), r.epochs.end(), [](const auto& m) { return m.mfu > 0; });
  std::vector<std::string> header{"epoch", "train loss", "test loss", "test ppl"};
  if (text) header.push_back("test bits/byte");
  header.insert(header.end(), {"test acc", "time (s)", "tok/s"});
  if (mfu) header.push_back("MFU");
  Table table(header);
  for (const auto& m : r.epochs) {
    std::vector<std::string> row{std::to_string(m.epoch) + (m.partial ? "*" : ""), format("%.4f", m.train_loss),
                                 m.evaluated ? format("%.4f", m.test_loss) : "-",
                                 m.evaluated ? format("%.2f", observe::perplexity(m.test_loss)) : "-"};
    if (text) row.push_back(m.evaluated ? format("%.3f", observe::bits_per_byte(m.test_loss)) : "-");
    row.insert(row.end(), {m.evaluated ? format("%.2f%%", 100 * m.test_acc) : "-", format("%.1f", m.epoch_seconds),
                           format("%.0f", m.tokens_per_second)});
    if (mfu) row.push_back(format("%.1f%%", 100 * m.mfu));
    table.add_row(row);
  }
  std::printf("\n%s", table.render().c_str());
  if (r.epochs.back().partial) std::printf("* stopped by --max-steps\n");
  const auto& last = r.epochs.back();
  std::string result = "not evaluated";
  if (last.evaluated) {
    result = format("test loss %.4f nats/token (perplexity %.2f", last.test_loss, observe::perplexity(last.test_loss)) +
             (text ? format(", %.3f bits per byte)", observe::bits_per_byte(last.test_loss)) : std::string(")"));
  }
  std::printf("\n%s on %s, batch %lld x %lld tokens, device %s: %s after %lld steps, %.1f s\n", o.model.c_str(),
              o.data.c_str(), static_cast<long long>(o.batch_size), static_cast<long long>(engine::resolved_seq_len(o)),
              o.device.c_str(), result.c_str(), static_cast<long long>(r.steps), r.seconds);
  std::fflush(stdout);
}

void print_summary(const engine::TrainOptions& o, const engine::TrainResult& r) {
  if (models::is_language_model(o.model)) {
    print_language_summary(o, r);
    return;
  }
  Table table({"epoch", "train loss", "train acc", "test loss", "test acc", "time (s)", "img/s"});
  for (const auto& m : r.epochs) {
    table.add_row({std::to_string(m.epoch) + (m.partial ? "*" : ""), format("%.4f", m.train_loss),
                   format("%.2f%%", 100 * m.train_acc),
                   m.evaluated ? format("%.4f", m.test_loss) : "-",
                   m.evaluated ? format("%.2f%%", 100 * m.test_acc) : "-",
                   format("%.1f", m.epoch_seconds),
                   format("%.0f", m.images_per_second)});
  }
  std::printf("\n%s", table.render().c_str());
  if (!r.epochs.empty() && r.epochs.back().partial) {
    std::printf("* stopped by --max-steps\n");
  } else if (!r.epochs.empty() && o.max_steps > 0 && r.steps >= o.max_steps && r.epochs.back().epoch < o.epochs) {
    // It ended at an epoch's end: no epoch is partial, yet some were not run.
    std::printf("stopped by --max-steps %lld after epoch %lld of %lld\n", static_cast<long long>(o.max_steps),
                static_cast<long long>(r.epochs.back().epoch), static_cast<long long>(o.epochs));
  }
  print_devices_table(o, r);
  bool evaluated = !r.epochs.empty() && r.epochs.back().evaluated;
  std::string accuracy = evaluated ? format("test accuracy %.2f%%", 100 * r.epochs.back().test_acc)
                                   : std::string("not evaluated");
  std::printf("\n%s on %s, batch %lld, device %s: %s after %lld steps, %.1f s\n",
              o.model.c_str(), o.data.c_str(), static_cast<long long>(o.batch_size),
              o.device.c_str(), accuracy.c_str(), static_cast<long long>(r.steps), r.seconds);
  std::fflush(stdout);
}

}  // namespace

engine::TrainOptions parse_train_flags(const std::vector<std::string>& args) {
  engine::TrainOptions options;
  auto flags = train_flags(options);
  std::map<std::string, std::string> origins;
  parse_with_origins(flags, with_config_file(args, flags, &origins), origins);
  internal::complete_train_options(options, flags);
  return options;
}

std::string train_help() {
  engine::TrainOptions defaults;
  return train_flags(defaults).help();
}

int train_command(const std::vector<std::string>& command_line) {
  engine::TrainOptions options;
  auto flags = train_flags(options);
  // Note [job files]: --config's flags first, the command line's after.
  std::map<std::string, std::string> origins;
  const auto args = with_config_file(command_line, flags, &origins);
  parse_with_origins(flags, args, origins);
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  internal::complete_train_options(options, flags);
  const bool worker = env::get("RANK").has_value();
  // The run's effective configuration, which rank 0 writes once the run
  // has started (engine/run_record.h).
  options.effective_config = config_text(args, flags);
  // Under another launcher (tandem launch, torchrun, Slurm's srun setting
  // RANK) this process is one worker already: --nproc-per-node would be
  // ignored, and the job run with fewer processes than asked. Refused.
  if (worker && !env::get(internal::kSelfLaunched).has_value() && flags.given("nproc-per-node") &&
      options.nproc_per_node != "0") {
    throw UsageError("--nproc-per-node " + options.nproc_per_node + ": this process is already rank " +
                     env::get("RANK").value_or("") + " of a launched job (RANK is set in its environment, by "
                     "tandem launch, torchrun or another launcher), so it starts no workers of its own; leave "
                     "--nproc-per-node out under a launcher (its own --nproc-per-node sets the processes), or "
                     "unset RANK");
  }
  // The launcher's flag: under another launcher that one restarts (or not).
  if (worker && !env::get(internal::kSelfLaunched).has_value() && options.max_restarts > 0) {
    throw UsageError("--max-restarts: this process is already rank " + env::get("RANK").value_or("") +
                     " of a launched job, whose launcher restarts its workers (tandem launch --max-restarts)");
  }
  if (worker && !env::get(internal::kSelfLaunched).has_value() && options.mesh.is_auto()) {
    throw UsageError("--mesh auto is chosen by tandem train's own launcher (--nproc-per-node N) before its workers "
                     "start; this process is rank " + env::get("RANK").value_or("") + " of a job another launcher "
                     "started: give the mesh itself (tandem plan suggests one)");
  }
  if (!worker) {
    if (auto counts = internal::sweep_counts(options.nproc_per_node)) {
      return internal::train_sweep(*counts, args, options, flags);
    }
  }
  int64_t nproc = local_workers(options);
  if (!worker && nproc > 0 && options.mesh.is_auto()) {
    // The planner's layout (auto_mesh.h), chosen once here: the workers run its flags.
    const auto chosen = internal::choose_layout(options, flags, args, nproc);
    std::printf("tandem: %s\n", chosen.summary.c_str());
    std::fflush(stdout);
    engine::TrainOptions planned;
    auto planned_flags = train_flags(planned);
    planned_flags.parse(chosen.args);
    internal::complete_train_options(planned, planned_flags);
    return internal::launch_workers(planned, chosen.args, nproc, {{internal::kPlanned, chosen.prediction}});
  }
  if (!worker && nproc == 0 && options.max_restarts > 0) {
    throw UsageError("--max-restarts goes with --nproc-per-node N: the launcher restarts the workers it started");
  }
  if (nproc > 0 && !worker) return internal::launch_workers(options, args, nproc, {});
  // --count-memory: every CPU tensor of this rank counted from here on, the
  // counter outliving the trainer (a tensor freed after it goes uncounted).
  std::optional<engine::CountingCpuAllocator> counting;
  if (options.count_memory) {
    TANDEM_CHECK_USAGE(engine::parse_device(options.device).is_cpu(), "--count-memory counts the CPU allocator's "
                       "tensors; --device ", options.device, " allocates elsewhere");
    counting.emplace();
  }
  engine::Trainer trainer(options);
  if (engine::parse_device(options.device).is_cpu()) engine::limit_memory_to_available();  // Note [memory limit]
  auto result = trainer.run();
  // The trainer's options: the global batch as --batch-per-process made it.
  if (trainer.rank() == 0) {
    print_summary(trainer.options(), result);
    if (!result.epochs.empty()) {
      const auto& last = result.epochs.back();
      const auto line = internal::planned_against_measured(last.tokens_per_second, last.images_per_second,
                                                             last.comm_bytes_per_step);
      if (!line.empty()) std::printf("%s\n", line.c_str());
    }
  }
  return 0;
}

int models_command(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::printf("usage: tandem models\n\nList the model names --model accepts, one a line.\n");
    return 0;
  }
  if (!args.empty()) throw UsageError("tandem models takes no arguments (but --help)");
  for (const auto& name : models::model_names()) std::printf("%s\n", name.c_str());
  return 0;
}

}  // namespace tandem::cli
