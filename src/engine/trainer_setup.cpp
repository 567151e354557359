// The trainer's set-up: options checked, the process group joined, data
// opened, the model built and wrapped for its strategy (trainer.h); the
// weights files are run_weights.cpp's.
#include "tandem/engine/expert_load.h"
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <limits>
#include <map>
#include <unordered_set>

#include <nlohmann/json.hpp>


#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/source.h"
#include "tandem/dist/collectives.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/run_setup.h"
#include "tandem/models/activation_checkpoint.h"
#include "tandem/models/registry.h"
#include "tandem/optim/grad_scaler.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/parallel/stage_split.h"
#include "tandem/parallel/sync_batch_norm.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/parse.h"
#include "tandem/util/table.h"

namespace tandem::engine {

// Note [a job the program made]: a Trainer joins the job its launcher
// describes in the environment, or one whose group the calling program made
// itself: ranks as threads of one process over Gloo (the tests' layouts,
// each a few threads rather than a few processes), or an application that
// rendezvoused on its own. Nothing else in the Trainer depends on how the
// ranks came to be; what threads share in one process (the default random
// generator) is guarded where it is used (Note [seeded model]).
Trainer::Trainer(TrainOptions options, std::FILE* log, std::shared_ptr<dist::ProcessGroup> job)
    : options_(std::move(options)), log_(log), warnings_log_(log), device_(parse_device(options_.device)) {
  const auto& o = options_;
  check_train_options(o);  // the command line alone (exit 2), before anything is joined or read
  auto profile_options = observe::parse_profile_steps(o.profile_steps);
  profile_options.path = o.profile_out;
  const bool pipeline = pipelined(o);
  if ((mesh_.groups.data = job ? std::move(job) : join_job(o, device_))) {
    mesh_.groups.job = mesh_.groups.data;
    rank_ = mesh_.groups.data->rank();
    world_ = mesh_.groups.data->size();
  }
  job_world_ = world_;
  check_train_ranks(o, world_);
  layout_ = parallel_layout(o, world_);
  data_rank_ = rank_;
  if (layout_.split_mesh()) {
    // Note [replicated stages]: the mesh's groups are split off once every
    // rank's settings are known to agree (below); its coordinates now. The
    // ranks of a tp group read the same batches, and so do those of a cp
    // group: the data see the dp ranks.
    const int64_t cp = layout_.context_ranks();
    world_ = layout_.data_ranks() / cp;
    data_rank_ = dist::mesh_coordinates(layout_.mesh, rank_)[static_cast<size_t>(dist::MeshDim::kData)] / cp;
  } else if (pipeline && world_ > 1) {
    // Note [pipeline over ranks]: one stage per rank, each on its own
    // --device; every rank reads the whole batch (stage 0 feeds it in, the
    // last stage takes the targets), so there is no data parallelism: the
    // data and the checkpoints see one process (world_ 1), the ranks being
    // mesh_.groups.pipeline.
    mesh_.groups.pipeline = std::move(mesh_.groups.data);
    world_ = 1;
  }
  if (o.batch_per_process > 0) options_.batch_size = o.batch_per_process * world_;  // seed 002's setting
  if (rank_ != 0) log_ = nullptr;  // rank 0 speaks for the job
  // --profile-out: its folder is checked now, before the data are opened.
  profiler_ = std::make_unique<observe::StepProfiler>(profile_options, rank_);

  data_ = open_run_data(o);
  const auto info = data_.train->info();
  check_same_settings();  // before the first collective that would assume them (Note [same settings])
  mesh_.split_groups(layout_);
  auto model_options = model_options_for(o, info);
  if (o.sync_bn) {  // also with one rank: the same arithmetic whatever the world size
    auto group = mesh_.groups.data;
    model_options.norm_layer = [group](int64_t channels) {
      return torch::nn::AnyModule(
          parallel::SyncBatchNorm(parallel::SyncBatchNormOptions{channels}, group));
    };
  }
  model_ = build_model(o, info, model_options, device_);
  experts_ = count_experts(model_);
  check_tied_weights(pipeline);
  // --init-weights: start from saved weights (every rank reads the same
  // file; DDP's broadcast below would also carry rank 0's).
  if (!o.init_weights.empty()) {
    try {
      std::vector<std::string> except;
      for (const auto& name : split(o.init_weights_except, ',')) {
        if (!name.empty()) except.push_back(name);
      }
      // A language model's weights may be transformers' (a save_pretrained
      // folder, or its model.safetensors), under their names.
      const bool language = info.seq_len > 0;
      std::error_code ec;
      const bool folder = std::filesystem::is_directory(o.init_weights, ec);
      std::optional<checkpoint::SafetensorsFile> file;
      if (!(language && folder)) file = checkpoint::read_safetensors(o.init_weights);  // names what else it is
      if (language && (folder || checkpoint::has_hf_names(*file))) {
        TANDEM_CHECK_USAGE(except.empty(), "--init-weights-except applies to tandem's weights files, not to "
                           "transformers' ", o.init_weights);
        checkpoint::load_hf_weights(o.init_weights, model_, o.model, info.num_classes);
      } else {
        load_weights(*file, o.init_weights, except);
      }
    } catch (const Error& e) {
      const char* flags = o.init_weights_except.empty() ? "--init-weights: " : "--init-weights, --init-weights-except: ";
      // A name the model does not have is the command line's mistake (exit 2).
      if (dynamic_cast<const UsageError*>(&e) != nullptr) throw UsageError(flags + std::string(e.what()));
      TANDEM_FAIL(flags, e.what());
    }
  }
  // --channels-last: 4-D weights in NHWC order; inputs follow in the
  // prefetcher and in evaluation.
  if (o.channels_last) channels_last_weights_ = models::to_channels_last(*model_);
  // --checkpoint-activations: segments of the top-level layers recomputed in
  // backward (Note [activation checkpointing]).
  if (o.checkpoint_activations > 0) {
    const auto layers = static_cast<int64_t>(model_->size());
    TANDEM_CHECK_USAGE(o.checkpoint_activations <= layers, "--checkpoint-activations ", o.checkpoint_activations,
                 ": ", o.model, " has ", layers, " top-level layers to cut into segments");
    // A pipeline's stages recompute themselves (make_pipeline).
    // A pipeline's stages and FSDP's units recompute themselves.
    if (!pipeline && o.strategy != Strategy::kFsdp) {
      model_->checkpoint_segments(models::plan_segments(layers, o.checkpoint_activations));
    }
  }
  if (o.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
  // --cuda-graph: one process, one device, a step that never waits on the
  // host (Note [what a captured step may do] in engine/cuda_graph.h).
  TANDEM_CHECK(!o.cuda_graph || cuda_graphs_built(), "--cuda-graph: this tandem was built against a "
               "libtorch without CUDA");
  // What the model is trained for (engine/task.h): its predictions are
  // rows of images, or every token of a window.
  tokens_per_sample_ = info.seq_len;
  task_ = info.seq_len > 0 ? language_model_task(o.label_smoothing) : classification_task(o.label_smoothing);
  parameter_count_ = models::count_parameters(*model_);  // the whole model's, before tp cuts it
  mesh_.cut_over_tensor_ranks(model_, o, info.seq_len);  // under tp: the model cut, and its task
  mesh_.cut_over_context_ranks(model_, o, info.seq_len);  // under cp: its attention over the ring
  mesh_.cut_over_expert_ranks(model_, o);  // under ep: its experts spread (Note [expert dispatch])
  if (mesh_.tensor) say(mesh_.tensor->describe());
  task_ = mesh_.task(task_, o.label_smoothing);
  if (info.seq_len > 0) {
    if (auto flops = models::model_traits(o.model).flops_per_token) flops_per_token_ = flops(model_options);
  }
  amp_ = autocast_dtype(o.amp);
  // Over a pipeline's ranks each holds its own stage's gradients, and an
  // inf in any of them skips the step on all.
  if (amp_ == torch::kHalf) {
    // Under a mesh the whole job: FSDP's shards differ between dp ranks,
    // and tensor parallelism's parts between tp ranks.
    scaler_ = std::make_unique<optim::GradScaler>(optim::GradScalerOptions{}, mesh_.inf_check_group());
  }
  if (pipeline) {
    mesh_.groups.pipeline ? make_rank_pipeline(info) : make_pipeline(info);
  } else {
    WholeModelSettings whole;
    whole.grad_accum = o.grad_accum;
    whole.unequal_batches = o.skip_bad_images;
    whole.group = mesh_.groups.data;
    whole.data_ranks = world_;
    stage_plan_ = make_whole_model_plan(model_, device_, step_settings(), whole);
  }
  // The dp dimension's plan, over the model or, under a mesh, over this
  // rank's pipeline pieces (Note [replicated stages]): their gradients are
  // then reduced over the pipeline's last backwards (step()).
  DataPlanSetup plan;
  plan.options = &o;
  plan.layout = layout_;
  plan.model = model_;
  mesh_.fill(plan);
  plan.data_ranks = world_;
  plan.device = device_;
  plan.parameter_count = parameter_count_;
  plan_ = make_data_plan(plan);
  mesh_.join(*plan_, o.model, o.strategy, [this] { return placed_parameters(/*gradients=*/true); });
}

// Note [tied embedding] (models/gpt2.h): the head reads the embedding's
// tensor. That holds within one process and device (one replica, DDP's,
// DataParallel's copies), within FSDP (Note [fsdp tied weights]) and over
// a pipeline's ranks (Note [tied weights across stages]), with FSDP over
// the stages too (Note [tied weights under fsdp]). Not yet carried: a
// pipeline over several devices of one process.
void Trainer::check_tied_weights(bool pipeline) const {
  const auto& o = options_;
  if (model_->ties().empty() || !pipeline) return;
  if (mesh_.groups.pipeline) return;  // Note [tied weights across stages], under FSDP too
  bool one_device = true;
  const auto devices = parallel::parse_devices(o.devices);
  for (const auto& d : devices) one_device = one_device && d == devices.front();
  TANDEM_CHECK_USAGE(one_device, "pipeline: ", o.model, "'s output layer is tied to its token embedding, and its "
                     "first and last stages would run on other devices, each with its own copy; not supported yet "
                     "(a pipeline over --devices of one device, a pipeline over ranks, or a model with an untied "
                     "head such as llama-tiny)");
}

// --strategy pipeline: cut the model into one stage per device (or
// --virtual-stages per device, interleaved), by --pipeline-split or
// balanced by --pipeline-balance, and move the stages.
void Trainer::make_pipeline(const data::DatasetInfo& info) {
  const auto& o = options_;
  auto devices = parallel::parse_devices(o.devices);
  const int64_t chunks = virtual_stages();
  auto [sizes, how] = pipeline_cut(info, static_cast<int64_t>(devices.size()), devices[0], true, "");
  pipeline_split_ = parallel::describe_split(model_, sizes) + " (" + how + ")";
  parallel::PipelineOptions pipeline_options{o.micro_batches, option_name(o.schedule), amp_};
  pipeline_options.virtual_stages = chunks;
  pipeline_options.recompute = o.checkpoint_activations > 0;  // --checkpoint-activations 1
  stage_plan_ = make_local_pipeline_plan(model_, sizes, devices, pipeline_options, step_settings());
  device_ = devices.back();  // outputs, targets and the loss live on the last stage
}

int64_t Trainer::virtual_stages() const { return resolved_virtual_stages(options_); }

// The cut into stages x --virtual-stages pieces, and how it was chosen:
// --pipeline-split, or balanced by parameter count, or by forward and
// backward time measured on a copy of the model on `on` at the micro-batch
// size (only when `measure`; otherwise zeros, to be filled in by the
// caller); `where` follows "balanced by measured time" in the description.
std::pair<std::vector<int64_t>, std::string> Trainer::pipeline_cut(const data::DatasetInfo& info, int64_t stages,
                                                                   const torch::Device& on, bool measure,
                                                                   const std::string& where) {
  const auto& o = options_;
  const int64_t chunks = virtual_stages();
  // A split or a count of stages the model cannot take is the command
  // line's (--pipeline-split, --devices, --virtual-stages): exit 2.
  if (!o.pipeline_split.empty()) {
    return {as_usage_error([&] { return parallel::split_at_names(model_, o.pipeline_split, stages * chunks); }),
            "--pipeline-split"};
  }
  const int64_t layers = static_cast<int64_t>(model_->size());
  TANDEM_CHECK_USAGE(layers >= stages * chunks, "pipeline: the model has ", layers, " layers, fewer than the ",
                     stages * chunks, " stages (", stages, " devices", chunks > 1 ? " x --virtual-stages " : "",
                     chunks > 1 ? std::to_string(chunks) : std::string(), ")");
  // Under tensor, context or expert parallelism the layers run collectives
  // over the tp, cp or ep group, so rank 0 cannot time them alone; with --dropout
  // the masks are seeded per stage (Note [dropout seeds]), so every run of
  // the job (a resumed one too) must cut alike, which timings do not:
  // balanced by parameter count.
  if (o.pipeline_balance == PipelineBalance::kParams || mesh_.groups.tensor || mesh_.groups.context ||
      mesh_.groups.expert || o.dropout > 0) {
    return {parallel::balance_interleaved(parallel::parameter_costs(model_), stages, chunks),
            "balanced by parameter count"};
  }
  const std::string measured = "balanced by measured time" + where;
  if (!measure) return {std::vector<int64_t>(stages * chunks, 0), measured};
  auto rows = std::max<int64_t>(1, o.batch_size / o.micro_batches);
  auto sample = info.seq_len > 0  // token ids
                    ? torch::zeros({rows, info.seq_len}, torch::TensorOptions().dtype(torch::kInt64).device(on))
                    : torch::full({rows, info.channels, info.height, info.width}, 0.5,
                                  torch::TensorOptions().dtype(models::parameter_dtype(*model_)).device(on));
  return {parallel::balance_interleaved(parallel::measured_costs(model_, sample), stages, chunks), measured};
}

// --strategy pipeline over ranks (Note [pipeline over ranks]): the model
// cut into ranks x --virtual-stages pieces, rank r keeping pieces r, r + S,
// ...; rank 0 chooses the cut (a measured balance differs from machine to
// machine) and broadcasts it.
void Trainer::make_rank_pipeline(const data::DatasetInfo& info) {
  const auto& o = options_;
  const int64_t stages = mesh_.groups.pipeline->size(), rank = mesh_.groups.pipeline->rank(), chunks = virtual_stages();
  const int64_t pieces = stages * chunks;
  auto [sizes, how] = pipeline_cut(info, stages, device_, rank_ == 0, " on rank 0");
  const auto wire = mesh_.groups.pipeline->wire_device();
  auto chosen = torch::tensor(sizes, torch::kInt64).to(wire);
  // Every replica pipeline cuts where job rank 0 chose: over the dp slice
  // through it (the first stages), their tp slices, then down each pipeline.
  if (mesh_.groups.mesh) mesh_.groups.data->broadcast(chosen, 0).wait();
  if (mesh_.groups.tensor) mesh_.groups.tensor->broadcast(chosen, 0).wait();
  mesh_.groups.pipeline->broadcast(chosen, 0).wait();
  chosen = chosen.cpu();
  sizes.assign(chosen.data_ptr<int64_t>(), chosen.data_ptr<int64_t>() + pieces);
  pipeline_split_ = parallel::describe_split(model_, sizes) + " (" + how + ")";
  auto cut = parallel::split_sequence(model_, sizes);
  std::vector<models::Sequence> mine;
  for (int64_t k = 0; k < pieces; ++k) {
    if (k % stages == rank) {
      mine.push_back(cut[k]);
    } else {
      // Another rank's piece: only read when the stages are gathered, so
      // it need not take device memory.
      if (device_.is_cuda()) cut[k]->to(torch::kCPU);
      mesh_.others_pieces.push_back(cut[k]);
    }
  }
  parallel::PipelineOptions pipeline_options{o.micro_batches, option_name(o.schedule), amp_};
  pipeline_options.virtual_stages = chunks;
  pipeline_options.recompute = o.checkpoint_activations > 0;  // --checkpoint-activations 1
  mesh_.own_pieces = mine;
  mesh_.tied = TiedStages::make(cut, mesh_.groups.pipeline, mesh_.groups.data, device_);
  if (mesh_.tied) say("tied weight: " + mesh_.tied->describe());
  stage_plan_ =
      make_rank_pipeline_plan(model_, mine, device_, mesh_.groups.pipeline, pipeline_options, step_settings());
}

// Note [same settings]: `tandem launch` and --nproc-per-node give every
// rank the same flags, but ranks started by hand (or by a script that
// builds each rank's command) may differ. Then the job went wrong in ways
// that never named the cause: another --lr or --seed trained replicas that
// drifted apart and reported a score of neither (exit 0); another
// --batch-size or --dtype made Gloo abort the process (SIGABRT) on the
// first mismatched collective; another --epochs ended one rank with a
// full, normal-looking table and the other with "connection reset". So
// every rank's settings are gathered before the first collective on the
// model, and a difference is a usage error on every rank that names the
// fields. The settings are the checkpoint's fingerprint without the data's
// path (a node may keep the files elsewhere; their sizes are compared
// instead, and a digest of their contents: Note [content digest] in
// src/data/image_dataset.cpp), plus what else the ranks must agree on to
// stay in step. What is the rank's own is left out: --device, --workers,
// --progress, the output files, --dist-timeout, --checkpoint-activations.
std::string Trainer::job_settings() const {
  const auto& o = options_;
  return checkpoint::without_fields(fingerprint(), {"data"}) +
         format(" data_content=%08x/%08x", data_.train->content_digest(), data_.test ? data_.test->content_digest() : 0u) +
         format(" test_samples=%lld strategy=%s grad_accum=%lld max_steps=%lld shard_optimizer=%d "
                "skip_bad_images=%d checkpoints=%d checkpoint_every=%lld resume=%d checkpoint_format=%s",
                static_cast<long long>(data_.test ? data_.test->size() : 0), strategy_name(o.strategy).c_str(),
                static_cast<long long>(o.grad_accum), static_cast<long long>(o.max_steps), o.shard_optimizer,
                o.skip_bad_images, !o.checkpoint_dir.empty(), static_cast<long long>(o.checkpoint_every),
                o.resume, option_name(o.checkpoint_format).c_str()) +
         (o.strategy == Strategy::kFsdp ? format(" fsdp_sharding=%s fsdp_min_unit_params=%lld", option_name(o.fsdp_sharding).c_str(),
                                        static_cast<long long>(o.fsdp_min_unit_params))
                               : std::string()) +
         format(" mesh=%s", layout_.mesh.str().c_str()) +
         (layout_.pipeline
              ? format(" schedule=%s virtual_stages=%lld pipeline_split=%s pipeline_balance=%s", option_name(o.schedule).c_str(),
                       static_cast<long long>(virtual_stages()), o.pipeline_split.c_str(),
                       option_name(o.pipeline_balance).c_str())
              : format(" ddp_comm_hook=%s bucket_cap_mb=%g", option_name(o.ddp_comm_hook).c_str(), o.bucket_cap_mb));
}

void Trainer::check_same_settings() const {
  const auto& group = mesh_.groups.job;
  if (!group || group->size() == 1) return;
  const auto all = dist::all_gather_text(job_settings(), *group, device_);
  std::vector<int64_t> others;
  for (int64_t r = 1; r < group->size(); ++r) {
    if (all[r] != all[0]) others.push_back(r);
  }
  if (others.empty()) return;
  const int64_t me = group->rank();
  const int64_t named = all[me] != all[0] ? me : others.front();
  std::string ranks;
  for (size_t i = 0; i < others.size() && i < 8; ++i) ranks += (i ? ", " : "") + std::to_string(others[i]);
  if (others.size() > 8) ranks += format(", ... (%zu ranks)", others.size());
  const std::string label = "on rank " + std::to_string(named);
  const auto differences = checkpoint::fingerprint_differences(all[0], all[named], {}, "on rank 0", label);
  // Only the data's digests differ: the flags agree and the data do not.
  const bool data_only = checkpoint::without_fields(all[0], {"data_content"}) ==
                         checkpoint::without_fields(all[named], {"data_content"});
  throw UsageError(detail::str_cat(
      "rank", others.size() > 1 ? "s " : " ", ranks, others.size() > 1 ? " were" : " was",
      " started with other settings than rank 0: ", differences,
      data_only ? "; the data sets are of one size but differ (digests of the training/test splits: their labels "
                  "in order, class names and, for IDX and CIFAR, their images): every rank of a job must read the "
                  "same data"
                : "; every rank of a job must be given the same flags (tandem launch and --nproc-per-node do that)"));
}

std::string Trainer::fingerprint() const {
  const auto& o = options_;
  // A format's default given explicitly is written as the default is
  // (empty, 0), so that --augment none or --image-size 28 on Fashion-MNIST
  // resumes a run that left them out, and the other way round.
  const std::string augment = o.augment == data_.default_augment ? std::string() : o.augment;
  const int64_t image_size = o.image_size == data_.default_image_size ? 0 : o.image_size;
  return format("model=%s dtype=%s amp=%s width=%g stem=%s sync_bn=%d data=%s augment=%s image_size=%lld epochs=%lld batch=%lld lr=%g min_lr=%g "
                "warmup=%g momentum=%g nesterov=%d wd=%g smoothing=%g seed=%llu world=%lld",
                o.model.c_str(), option_name(o.dtype).c_str(), option_name(o.amp).c_str(), o.width_mult, o.stem.c_str(), o.sync_bn, o.data.c_str(), augment.c_str(),
                static_cast<long long>(image_size), static_cast<long long>(o.epochs), static_cast<long long>(o.batch_size), o.lr,
                o.min_lr, o.warmup_epochs, o.momentum, o.nesterov, o.weight_decay,
                o.label_smoothing, static_cast<unsigned long long>(o.seed),
                static_cast<long long>(world_)) +
         // Only when set, so that checkpoints from before the flag still resume.
         (o.clip_grad_norm > 0 ? format(" clip=%g", o.clip_grad_norm) : std::string()) +
         (o.dropout > 0 ? format(" dropout=%g", o.dropout) : std::string()) +
         // Language models: what the windows are and how the weights move.
         (data_.train->info().seq_len > 0
              ? format(" seq_len=%lld vocab=%lld", static_cast<long long>(data_.train->info().seq_len),
                       static_cast<long long>(data_.train->info().num_classes))
              : std::string()) +
         (resolved_optimizer(o) == Optimizer::kAdamW
              ? format(" optimizer=adamw beta1=%g beta2=%g eps=%g", o.beta1, o.beta2, o.adam_eps)
              : std::string()) +
         // Compared by run() itself when the checkpoint has it (older ones do not).
         format(" samples=%lld", static_cast<long long>(data_.train->size())) +
         // May change on resume; run() says what that does to BatchNorm.
         (layout_.pipeline ? format(" micro_batches=%lld", static_cast<long long>(o.micro_batches))
                           : std::string());
}

void Trainer::report_warnings(std::FILE* to) const { report_data_warnings(data_, to); }

std::map<std::string, std::string> Trainer::weights_metadata() const {
  return engine::weights_metadata(options_, data_);
}

std::map<std::string, std::string> Trainer::shape_settings() const { return engine::shape_settings(options_, data_); }

void Trainer::check_weights_metadata(const std::map<std::string, std::string>& metadata,
                                     const std::string& path) const {
  engine::check_weights_metadata(options_, data_, metadata, path);
}

void Trainer::load_weights(const checkpoint::SafetensorsFile& file, const std::string& path,
                           const std::vector<std::string>& except) {
  load_run_weights(options_, data_, file, path, *model_, except);
}

}  // namespace tandem::engine
