#include "tandem/engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/loader.h"
#include "tandem/data/source.h"
#include "tandem/dist/collectives.h"
#include "tandem/parallel/stage_split.h"
#include "tandem/parallel/sync_batch_norm.h"
#include "tandem/engine/checkpoint.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/safetensors.h"
#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/schedule.h"
#include "tandem/optim/sgd.h"
#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/progress.h"
#include "tandem/util/stopwatch.h"
#include "tandem/util/table.h"

namespace tandem::engine {

torch::Device parse_device(const std::string& text) {
  return parallel::parse_one_device(text, "--device", text, "cpu, cuda or cuda:N");
}

namespace {
data::LoaderOptions loader_options(int64_t batch_size, int64_t workers, const torch::Device& device) {
  data::LoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.pin_memory = device.is_cuda();
  return options;
}
// The dtype inputs are given in: the parameters' (--dtype).
torch::ScalarType compute_dtype(torch::nn::Module& model) {
  auto parameters = model.parameters();
  return parameters.empty() ? torch::kFloat32 : parameters.front().scalar_type();
}

}  // namespace

EvalResult evaluate(models::Sequence& model, const data::Dataset& dataset, int64_t batch_size,
                    const torch::Device& device, int64_t workers, dist::ProcessGroup* group,
                    const Forward& forward) {
  torch::NoGradGuard no_grad;
  bool was_training = model->is_training();
  model->eval();
  std::shared_ptr<const data::Sampler> sampler;
  if (group != nullptr && group->size() > 1) {
    std::vector<int64_t> mine;  // r, r + W, ...: every sample once over the ranks
    for (int64_t i = group->rank(); i < dataset.size(); i += group->size()) mine.push_back(i);
    sampler = std::make_shared<data::SubsetSampler>(std::move(mine));
  } else {
    sampler = std::make_shared<data::SequentialSampler>(dataset.size());
  }
  data::DataLoader loader(std::shared_ptr<const data::Dataset>(&dataset, [](auto*) {}), sampler,
                          loader_options(batch_size, workers, device));
  data::DevicePrefetcher batches(loader.epoch(0), data::PrefetchOptions{device, compute_dtype(*model)});
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  int64_t count = 0;
  while (auto batch = batches.next()) {
    if (batch->size() == 0) continue;
    const auto& inputs = batch->inputs;
    const auto& targets = batch->targets;
    auto logits = forward ? forward(inputs) : model->forward(inputs);
    loss_sum += torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    correct += logits.argmax(1).eq(targets).sum();
    count += batch->size();
  }
  model->train(was_training);
  // Summed over the ranks on the device (NCCL takes CUDA tensors only).
  auto sums = torch::stack({loss_sum, correct.to(torch::kFloat64),
                            torch::full({}, static_cast<double>(count), loss_sum.options())});
  if (group != nullptr && group->size() > 1) group->all_reduce(sums).wait();
  sums = sums.cpu();
  double loss = sums[0].item<double>(), hits = sums[1].item<double>(), total = sums[2].item<double>();
  if (total == 0) return {};
  return {loss / total, hits / total, static_cast<int64_t>(total)};
}

Trainer::Trainer(TrainOptions options, std::FILE* log)
    : options_(std::move(options)), log_(log), device_(parse_device(options_.device)) {
  const auto& o = options_;
  TANDEM_CHECK(o.epochs > 0, "--epochs: expected a positive integer, got ", o.epochs);
  TANDEM_CHECK(o.batch_size > 0, "--batch-size: expected a positive integer, got ", o.batch_size);
  TANDEM_CHECK(o.lr > 0, "--lr: expected a positive number, got ", o.lr);
  TANDEM_CHECK(o.momentum >= 0 && o.momentum < 1, "--momentum: expected [0, 1), got ", o.momentum);
  TANDEM_CHECK(!o.nesterov || o.momentum > 0, "--nesterov needs --momentum > 0");
  TANDEM_CHECK(o.weight_decay >= 0, "--weight-decay: expected >= 0, got ", o.weight_decay);
  TANDEM_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1,
               "--label-smoothing: expected [0, 1), got ", o.label_smoothing);
  TANDEM_CHECK(o.warmup_epochs >= 0 && o.warmup_epochs < o.epochs,
               "--warmup-epochs: expected [0, --epochs), got ", o.warmup_epochs);
  TANDEM_CHECK(o.max_steps >= 0, "--max-steps: expected >= 0, got ", o.max_steps);
  TANDEM_CHECK(o.grad_accum >= 1, "--grad-accum: expected a positive integer, got ", o.grad_accum);
  TANDEM_CHECK(std::isfinite(o.clip_grad_norm) && o.clip_grad_norm >= 0,
               "--clip-grad-norm: expected a finite number >= 0 (0: off), got ", o.clip_grad_norm);
  TANDEM_CHECK(o.workers >= 0 && o.workers <= 1024, "--workers: expected 0 to 1024, got ", o.workers);
  TANDEM_CHECK(!o.resume || !o.checkpoint_dir.empty(), "--resume needs --checkpoint-dir");
  TANDEM_CHECK(o.progress == "auto" || o.progress == "bar" || o.progress == "lines" ||
                   o.progress == "off",
               "--progress: expected auto, bar, lines or off, got '", o.progress, "'");

  TANDEM_CHECK(o.strategy == "auto" || o.strategy == "none" || o.strategy == "ddp" ||
                   o.strategy == "allreduce" || o.strategy == "dp" || o.strategy == "pipeline",
               "--strategy: expected auto, none, ddp, allreduce, dp or pipeline, got '", o.strategy, "'");
  const bool pipeline = o.strategy == "pipeline";
  TANDEM_CHECK(o.strategy == "dp" || pipeline || o.devices.empty(),
               "--devices goes with --strategy dp or pipeline");
  TANDEM_CHECK(o.strategy == "dp" || !o.dp_trace, "--dp-trace goes with --strategy dp");
  TANDEM_CHECK((o.strategy != "dp" && !pipeline) || !o.devices.empty(), "--strategy ", o.strategy,
               " needs --devices (e.g. cpu,cpu or cuda:0,cuda:1)");
  const TrainOptions defaults;  // a pipeline flag changed without --strategy pipeline is a mistake
  TANDEM_CHECK(pipeline || (o.micro_batches == defaults.micro_batches && o.schedule == defaults.schedule &&
                            o.pipeline_split == defaults.pipeline_split &&
                            o.pipeline_balance == defaults.pipeline_balance),
               "--micro-batches, --schedule, --pipeline-split and --pipeline-balance go with "
               "--strategy pipeline");
  TANDEM_CHECK(o.micro_batches >= 1, "--micro-batches: expected a positive integer, got ",
               o.micro_batches);
  TANDEM_CHECK(o.pipeline_balance == "time" || o.pipeline_balance == "params",
               "--pipeline-balance: expected time or params, got '", o.pipeline_balance, "'");
  TANDEM_CHECK(o.dist_timeout > 0 && o.dist_timeout <= 604800,
               "--dist-timeout: expected a positive number of seconds up to a week (604800), got ",
               o.dist_timeout);
  TANDEM_CHECK(o.bucket_cap_mb > 0 && o.bucket_cap_mb <= 1e6,
               "--bucket-cap-mb: expected a positive size up to 1e6 MiB, got ", o.bucket_cap_mb);
  if (auto rendezvous = dist::rendezvous_from_env()) {
    dist::GroupOptions g;
    g.backend = o.dist_backend;
    g.device = o.device;
    g.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout * 1000));
    // One GPU per local rank: a plain --device cuda means cuda:LOCAL_RANK.
    if (device_.is_cuda() && !device_.has_index()) {
      device_ = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                rendezvous->local_rank % torch::cuda::device_count()));
    }
    if (device_.is_cuda()) {  // NCCL and the caching allocator use the current device
      c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device_);
      g.device = device_.str();
    }
    group_ = std::make_shared<dist::ProcessGroup>(*rendezvous, g);
    rank_ = group_->rank();
    world_ = group_->size();
  }
  TANDEM_CHECK(world_ == 1 || (o.strategy != "dp" && !pipeline), "--strategy ", o.strategy,
               " runs in one process over --devices (this is rank ", rank_, " of ", world_,
               "); for several processes use --strategy ddp");
  TANDEM_CHECK(world_ == 1 || o.strategy != "none", "--strategy none: this process is rank ",
               rank_, " of ", world_, "; a job of several ranks needs a data-parallel strategy");
  TANDEM_CHECK(o.batch_size % world_ == 0, "--batch-size ", o.batch_size,
               ": not divisible by the world size ", world_,
               " (each rank takes batch-size / world size samples a step)");
  TANDEM_CHECK(o.grad_accum <= o.batch_size / world_, "--grad-accum ", o.grad_accum,
               ": more chunks than the ", o.batch_size / world_, " samples each rank takes a step "
               "(--batch-size ", o.batch_size, " over ", world_, " rank(s))");
  TANDEM_CHECK(!pipeline || o.grad_accum == 1, "--grad-accum does not go with --strategy pipeline: "
               "the pipeline already passes each batch in --micro-batches chunks and accumulates "
               "their gradients (raise --micro-batches instead)");
  if (rank_ != 0) log_ = nullptr;  // rank 0 speaks for the job

  data::DataOptions data_options;
  data_options.augment = o.augment;
  data_options.image_size = o.image_size;
  data_options.seed = o.seed;
  data_options.skip_bad_images = o.skip_bad_images;
  data_ = data::open_data(o.data, data_options);
  if (!o.val_data.empty()) data_.test = data::open_eval_data(o.val_data, data_options);
  auto info = data_.train->info();
  auto test_info = data_.test ? data_.test->info() : info;
  TANDEM_CHECK(info.channels == test_info.channels && info.height == test_info.height &&
                   info.width == test_info.width,
               "--val-data ", o.val_data, ": images are ", test_info.channels, "x",
               test_info.height, "x", test_info.width, " after transforms, but ",
               info.channels, "x", info.height, "x", info.width, " in --data ", o.data);

  if (!info.class_names.empty() && !test_info.class_names.empty()) {
    // Labels are the index of the class folder, so both must list the same.
    auto list = [](const std::vector<std::string>& names) {
      std::string text;
      for (size_t i = 0; i < names.size() && i < 8; ++i) text += (i ? ", " : "") + names[i];
      return names.size() > 8 ? text + ", ... (" + std::to_string(names.size()) + ")" : text;
    };
    TANDEM_CHECK(info.class_names == test_info.class_names, "--val-data ", o.val_data,
                 ": its classes (", list(test_info.class_names), ") are not those of --data ",
                 o.data, " (", list(info.class_names), "); labels are class folder indices, "
                 "so both need the same class folders");
  }
  torch::manual_seed(o.seed);
  models::ModelOptions model_options;
  model_options.in_channels = info.channels;
  model_options.num_classes = std::max(info.num_classes, test_info.num_classes);
  model_options.image_size = info.height;
  model_options.width_mult = o.width_mult;
  model_options.stem = o.stem;
  if (o.sync_bn) {  // also with one rank: the same arithmetic whatever the world size
    auto group = group_;
    model_options.norm_layer = [group](int64_t channels) {
      return torch::nn::AnyModule(
          parallel::SyncBatchNorm(parallel::SyncBatchNormOptions{channels}, group));
    };
  }
  model_ = models::make_model(o.model, model_options);
  TANDEM_CHECK(o.dtype == "float32" || o.dtype == "float64", "--dtype: expected float32 or float64, got '",
               o.dtype, "'");
  model_->to(device_, o.dtype == "float64" ? torch::kFloat64 : torch::kFloat32);
  // --channels-last: 4-D weights in NHWC order; inputs follow in the
  // prefetcher and in evaluation.
  if (o.channels_last) models::to_channels_last(*model_);
  TANDEM_CHECK(!o.cudnn_benchmark || device_.is_cuda(), "--cudnn-benchmark needs --device cuda (cuDNN "
               "runs only on CUDA devices), got --device ", o.device);
  if (o.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
  // --cuda-graph: one process, one device, a step that never waits on the
  // host (Note [what a captured step may do] in engine/cuda_graph.h).
  TANDEM_CHECK(!o.cuda_graph || device_.is_cuda(), "--cuda-graph needs --device cuda (a CUDA graph "
               "replays GPU kernels), got --device ", o.device);
  TANDEM_CHECK(!o.cuda_graph || cuda_graphs_built(), "--cuda-graph: this tandem was built against a "
               "libtorch without CUDA");
  TANDEM_CHECK(!o.cuda_graph || (o.strategy != "dp" && o.strategy != "pipeline" && world_ == 1),
               "--cuda-graph captures the step of one process on one device; it does not work with "
               "--strategy ", o.strategy, " or several ranks (this is rank ", rank_, " of ", world_, ")");
  loss_options_ = torch::nn::functional::CrossEntropyFuncOptions().label_smoothing(o.label_smoothing);
  amp_ = optim::parse_amp(o.amp);
  TANDEM_CHECK(!amp_ || o.dtype == "float32", "--amp ", o.amp, " needs --dtype float32 (autocast "
               "lowers float32 ops), got --dtype ", o.dtype);
  TANDEM_CHECK(!o.cuda_graph || o.grad_accum == 1, "--cuda-graph captures a step of one forward and "
               "backward; it does not work with --grad-accum ", o.grad_accum);
  TANDEM_CHECK(!o.cuda_graph || amp_ != torch::kHalf, "--cuda-graph does not work with --amp fp16: the "
               "loss scaler decides on the host whether to take each step; use --amp bf16");
  if (amp_ == torch::kHalf) scaler_ = std::make_unique<optim::GradScaler>(optim::GradScalerOptions{}, group_);
  if (o.strategy == "dp") {
    parallel::DataParallelOptions dp_options;
    dp_options.devices = parallel::parse_devices(o.devices);
    dp_options.output_device = device_;
    dp_options.trace = o.dp_trace;
    dp_ = parallel::DataParallel(model_, dp_options);
  }
  if (pipeline) make_pipeline(info);
  if (group_ && world_ > 1 && o.strategy != "allreduce") {
    parallel::DdpOptions ddp_options;
    ddp_options.buckets.bucket_bytes = static_cast<int64_t>(o.bucket_cap_mb * (1 << 20));
    ddp_options.buckets.first_bucket_bytes =
        std::min(ddp_options.buckets.first_bucket_bytes, ddp_options.buckets.bucket_bytes);
    ddp_options.buckets.last_bucket_bytes =
        std::min(ddp_options.buckets.last_bucket_bytes, ddp_options.buckets.bucket_bytes);
    ddp_options.comm_hook = parallel::make_comm_hook(o.ddp_comm_hook);
    ddp_ = std::make_unique<parallel::DistributedDataParallel>(model_.ptr(), group_, ddp_options);
  } else if (group_) {
    dist::broadcast_module(*model_, *group_);  // every rank starts from rank 0's weights
  }
}

// --strategy pipeline: cut the model into one stage per device, by
// --pipeline-split or balanced by --pipeline-balance, and move the stages.
void Trainer::make_pipeline(const data::DatasetInfo& info) {
  const auto& o = options_;
  auto devices = parallel::parse_devices(o.devices);
  const auto stages = static_cast<int64_t>(devices.size());
  std::vector<int64_t> sizes;
  std::string how;
  if (!o.pipeline_split.empty()) {
    sizes = parallel::split_at_names(model_, o.pipeline_split, stages);
    how = "--pipeline-split";
  } else if (o.pipeline_balance == "params") {
    sizes = parallel::balance_stages(parallel::parameter_costs(model_), stages);
    how = "balanced by parameter count";
  } else {
    // Timed on a copy, on the first device, at the micro-batch size.
    auto rows = std::max<int64_t>(1, o.batch_size / o.micro_batches);
    auto sample = torch::full({rows, info.channels, info.height, info.width}, 0.5,
                              torch::TensorOptions().dtype(compute_dtype(*model_)).device(devices[0]));
    sizes = parallel::balance_stages(parallel::measured_costs(model_, sample), stages);
    how = "balanced by measured time";
  }
  pipeline_split_ = parallel::describe_split(model_, sizes) + " (" + how + ")";
  pipeline_ = std::make_unique<parallel::Pipeline>(
      model_, sizes, devices, parallel::PipelineOptions{o.micro_batches, o.schedule, amp_});
  device_ = devices.back();  // outputs, targets and the loss live on the last stage
}

std::string Trainer::fingerprint() const {
  const auto& o = options_;
  return format("model=%s dtype=%s amp=%s width=%g stem=%s sync_bn=%d data=%s augment=%s image_size=%lld epochs=%lld batch=%lld lr=%g min_lr=%g "
                "warmup=%g momentum=%g nesterov=%d wd=%g smoothing=%g seed=%llu world=%lld",
                o.model.c_str(), o.dtype.c_str(), o.amp.c_str(), o.width_mult, o.stem.c_str(), o.sync_bn, o.data.c_str(), o.augment.c_str(),
                static_cast<long long>(o.image_size), static_cast<long long>(o.epochs), static_cast<long long>(o.batch_size), o.lr,
                o.min_lr, o.warmup_epochs, o.momentum, o.nesterov, o.weight_decay,
                o.label_smoothing, static_cast<unsigned long long>(o.seed),
                static_cast<long long>(world_)) +
         // Only when set, so that checkpoints from before the flag still resume.
         (o.clip_grad_norm > 0 ? format(" clip=%g", o.clip_grad_norm) : std::string());
}

void Trainer::report_warnings() const {
  for (const auto* dataset : {data_.train.get(), data_.test.get()}) {
    if (dataset == nullptr) continue;
    for (const auto& line : dataset->drain_warnings()) {
      if (log_) std::fprintf(log_, "tandem: warning: %s\n", line.c_str());
    }
  }
}

StepOutputs Trainer::step(const torch::Tensor& inputs, const torch::Tensor& targets,
                          torch::optim::Optimizer& optimizer, StepCounters& counters) {
  if (ddp_) {
    // Note [gradients are bucket views]: on CPU, letting backward's fresh
    // gradient be copied into the bucket once measured faster than zeroing
    // the bucket and accumulating into it (bench/ddp.sh, docs/PERFORMANCE.md);
    // on CUDA the in-place form saves the memory.
    if (device_.is_cuda()) {
      ddp_->zero_grad();
    } else {
      optimizer.zero_grad();
    }
    ddp_->before_forward();  // BatchNorm statistics from rank 0
  } else {
    optimizer.zero_grad();  // to none (under --cuda-graph: the captured backward assigns them)
    if (group_) dist::broadcast_buffers(*model_, *group_);
  }
  StepOutputs out;
  if (pipeline_) {  // forward and backward, micro-batch by micro-batch
    // Autocast per micro-batch forward in the stages (PipelineOptions); the
    // fp16 scaler scales each micro-batch's loss before its backward.
    parallel::LossScale scale;
    if (scaler_) scale = [this](const torch::Tensor& loss) { return scaler_->scale(loss); };
    auto micro = pipeline_->train_step(
        inputs, targets,
        [&](const torch::Tensor& output, const torch::Tensor& target) {
          return torch::nn::functional::cross_entropy(output, target, loss_options_);
        },
        scale);
    out.logits = micro.output;
    out.loss = micro.loss;
    auto idle = micro.idle_share();
    for (size_t s = 0; s < idle.size(); ++s) counters.stage_idle[s] += idle[s];
    ++counters.pipeline_steps;
  } else {
    // --grad-accum: the batch in chunks, one forward and backward each. Each
    // chunk's mean loss is weighted by its share of the batch, so the
    // gradients add up to those of the batch's mean loss; DDP all-reduces
    // only in the last chunk's backward.
    const int64_t rows = inputs.size(0);
    const int64_t chunks = std::min(options_.grad_accum, rows);
    auto input_chunks = inputs.tensor_split(chunks), target_chunks = targets.tensor_split(chunks);
    std::vector<torch::Tensor> logits;
    for (int64_t k = 0; k < chunks; ++k) {
      std::optional<parallel::DistributedDataParallel::NoSync> accumulate_only;
      if (ddp_ && k + 1 < chunks) accumulate_only.emplace(*ddp_);
      torch::Tensor loss;
      {
        optim::AutocastGuard autocast(device_.type(), amp_);  // forward and loss only
        const auto& x = input_chunks[k];
        logits.push_back(dp_ ? dp_->forward(x) : model_->forward(x));
        loss = torch::nn::functional::cross_entropy(logits.back(), target_chunks[k], loss_options_);
        if (chunks > 1) loss = loss * (static_cast<double>(x.size(0)) / static_cast<double>(rows));
      }
      (scaler_ ? scaler_->scale(loss) : loss).backward();
      out.loss = k == 0 ? loss : out.loss.detach() + loss.detach();
    }
    out.logits = chunks == 1 ? logits.front() : torch::cat(logits);
  }
  if (ddp_) {
    ddp_->after_backward();  // buckets were all-reduced during backward
  } else if (group_) {
    dist::average_gradients(*model_, *group_);  // seed 004's all-reduce after backward
  }
  if (options_.clip_grad_norm > 0) {  // on the averaged, unscaled gradients (the same on every rank)
    if (scaler_) scaler_->unscale(optimizer);
    optim::clip_grad_norm(model_->parameters(), options_.clip_grad_norm);
  }
  if (scaler_) {  // unscale; skip the step on inf/NaN (on every rank alike); adjust the scale
    if (!scaler_->step(optimizer)) ++counters.skipped_steps;
    scaler_->update();
  } else {
    optimizer.step();
  }
  return out;
}

void Trainer::say(const std::string& line) const {
  if (log_ && options_.progress != "off") std::fprintf(log_, "%s\n", line.c_str());
}

TrainResult Trainer::run() {
  const auto& o = options_;
  Stopwatch run_clock;
  TrainResult result;

  // --- Set-up: loader, optimizer, schedule ---------------------------------
  // Each rank takes its DistributedSampler share, batch-size / world a step:
  // together the ranks' k-th batches are the single-process k-th batch.
  std::shared_ptr<const data::Sampler> sampler;
  if (world_ > 1) {
    sampler = std::make_shared<data::DistributedSampler>(
        data_.train->size(), data::DistributedSamplerOptions{world_, rank_, true, o.seed, false});
  } else {
    sampler = std::make_shared<data::RandomSampler>(data_.train->size(), o.seed);
  }
  data::DataLoader loader(data_.train, sampler,
                          loader_options(o.batch_size / world_, o.workers, device_));
  const int64_t steps_per_epoch = loader.num_batches();
  TANDEM_CHECK(steps_per_epoch > 0, o.data, ": no training samples");
  optim::Sgd optimizer(model_->parameters(), torch::optim::SGDOptions(o.lr)
                                                 .momentum(o.momentum)
                                                 .nesterov(o.nesterov)
                                                 .weight_decay(o.weight_decay));
  optim::CosineSchedule schedule(
      {o.lr, o.min_lr, o.epochs * steps_per_epoch,
       static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch))});

  // --- Resume ----------------------------------------------------------------
  std::optional<Checkpointer> checkpointer;
  if (!o.checkpoint_dir.empty()) checkpointer.emplace(CheckpointOptions{o.checkpoint_dir});
  TrainPosition position;
  // A worker restarted by the launcher (--max-restarts) resumes by itself.
  bool resume = o.resume;
  if (!resume && env::get_int("TANDEM_RESTART_COUNT").value_or(0) > 0) {
    if (checkpointer) {
      resume = true;
      say(format("restart %lld: resuming from the newest checkpoint in %s",
                 static_cast<long long>(*env::get_int("TANDEM_RESTART_COUNT")), o.checkpoint_dir.c_str()));
    } else {
      say("restarted without --checkpoint-dir: starting from the beginning");
    }
  }
  if (checkpointer && !resume) {
    // Pruning keeps the newest checkpoints by step, so an earlier run's
    // later ones would replace this run's (and a restart would resume them).
    auto earlier = checkpointer->latest();
    TANDEM_CHECK(!earlier, "--checkpoint-dir ", o.checkpoint_dir, " already holds checkpoints of an "
                 "earlier run (newest: ", earlier.value_or(""), "); pass --resume to continue it, "
                 "or give an empty or new directory");
  }
  if (resume) {
    std::vector<std::string> damaged;
    auto path = checkpointer->load_newest_good(position, *model_, optimizer, fingerprint(), &damaged);
    for (const auto& line : damaged) {
      if (log_) std::fprintf(log_, "tandem: warning: %s\n", line.c_str());
    }
    if (path) {
      if (scaler_ && position.loss_scale > 0) {
        scaler_->load_state(position.loss_scale, position.scale_growth_tracker);
      }
      say(format("resumed from %s (epoch %lld, step %lld)", path->c_str(),
                 static_cast<long long>(position.epoch + 1), static_cast<long long>(position.step)));
    } else {
      say("no checkpoint in " + o.checkpoint_dir + ": starting from the beginning");
    }
  }
  MetricsWriter metrics;
  if (!o.metrics_out.empty() && rank_ == 0) metrics = MetricsWriter(o.metrics_out, /*append=*/resume && position.step > 0);

  if (!data_.test) say("no evaluation data for " + o.data + " (give --val-data): evaluation skipped");
  if (world_ > 1) {
    say(format("data parallel over %lld ranks (%s, %s): batch %lld per rank, %lld in all",
               static_cast<long long>(world_), ddp_ ? "ddp" : "allreduce",
               group_->backend().c_str(), static_cast<long long>(o.batch_size / world_),
               static_cast<long long>(o.batch_size)));
  }
  if (dp_) {
    std::string names;
    for (const auto& d : dp_->devices()) names += (names.empty() ? "" : ",") + d.str();
    say(format("DataParallel over %s in one process: the batch of %lld scattered, outputs gathered on %s",
               names.c_str(), static_cast<long long>(o.batch_size), device_.str().c_str()));
  }
  if (o.grad_accum > 1) {
    say(format("gradient accumulation: each rank's batch of %lld in %lld chunks, one optimizer step",
               static_cast<long long>(o.batch_size / world_), static_cast<long long>(o.grad_accum)));
  }
  if (o.clip_grad_norm > 0) say(format("gradients clipped to a global 2-norm of %g", o.clip_grad_norm));
  if (amp_) {
    say(amp_ == torch::kHalf
            ? "mixed precision: fp16 autocast with dynamic loss scaling (initial scale 65536)"
            : "mixed precision: bf16 autocast");
  }
  if (pipeline_) {
    std::string names;
    for (const auto& d : pipeline_->devices()) names += (names.empty() ? "" : ",") + d.str();
    say(format("pipeline over %s in one process: stages %s; %lld micro-batches, %s schedule",
               names.c_str(), pipeline_split_.c_str(), static_cast<long long>(o.micro_batches),
               o.schedule.c_str()));
  }
  say(format("training %s (%lld parameters) on %s, %lld steps/epoch, device %s",
             o.model.c_str(), static_cast<long long>(models::count_parameters(*model_)),
             data_.train->describe().c_str(), static_cast<long long>(steps_per_epoch),
             device_.str().c_str()));
  auto save = [&] {
    if (scaler_) {
      position.loss_scale = scaler_->get_scale();
      position.scale_growth_tracker = scaler_->growth_tracker();
    }
    if (checkpointer && rank_ == 0) result.last_checkpoint = checkpointer->save(position, *model_, optimizer, fingerprint());
  };

  // --cuda-graph: the plain step, captured after a few eager ones and then
  // replayed (engine/cuda_graph.h); the learning rate is read from a tensor.
  std::unique_ptr<CudaGraphStep> graphed;
  if (o.cuda_graph) {
    auto graph_options = capture_options_for(optimizer);
    // The counters stay untouched: --cuda-graph means no pipeline and no scaler.
    graphed = std::make_unique<CudaGraphStep>(device_, [&](const torch::Tensor& x, const torch::Tensor& y) {
      StepCounters unused;
      return step(x, y, optimizer, unused);
    }, graph_options);
    say(format("CUDA graph: the step is captured after %lld eager steps and replayed (a batch of "
               "another size runs eagerly)", static_cast<long long>(CudaGraphOptions{}.warmup_steps)));
  }

  // --- Epochs ----------------------------------------------------------------
  // Resumed at --max-steps already (the checkpoint of the run that stopped
  // there): nothing more to train.
  bool stop = o.max_steps > 0 && position.step >= o.max_steps;
  if (stop) {
    say(format("step %lld reached --max-steps %lld already: nothing to train",
               static_cast<long long>(position.step), static_cast<long long>(o.max_steps)));
  }
  for (; position.epoch < o.epochs && !stop; ++position.epoch) {
    model_->train();
    std::optional<Progress> progress;
    if (log_ && o.progress != "off") {
      progress.emplace(ProgressOptions{
          format("epoch %lld/%lld", static_cast<long long>(position.epoch + 1),
                 static_cast<long long>(o.epochs)),
          steps_per_epoch, "img",
          o.progress == "bar" || (o.progress == "auto" && is_terminal(log_)), 10.0, log_});
    }
    Stopwatch epoch_clock;
    int64_t images_this_run = 0;
    StepCounters counters;
    counters.stage_idle.assign(pipeline_ ? pipeline_->devices().size() : 0, 0.0);
    double lr = 0.0;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    // Folds the device-side sums into the position; over all ranks, so every
    // rank calls it at the same steps (Note: a collective).
    auto sync_sums = [&] {
      // On the device: NCCL takes CUDA tensors only.
      auto sums = torch::stack({loss_sum, correct.to(torch::kFloat64)});
      if (group_) group_->all_reduce(sums).wait();
      sums = sums.cpu();
      double loss = sums[0].item<double>(), hits = sums[1].item<double>();
      position.epoch_loss_sum += loss;
      position.epoch_correct += static_cast<int64_t>(std::llround(hits));
      loss_sum.zero_();
      correct.zero_();
    };
    // Batch k + 1 is copied to the device while step k runs (Note [prefetch stream]).
    std::optional<data::DevicePrefetcher> batches;
    batches.emplace(loader.epoch(position.epoch, position.batch_in_epoch),
                    data::PrefetchOptions{device_, compute_dtype(*model_), o.channels_last});
    while (auto batch = batches->next()) {
      TANDEM_CHECK(batch->size() > 0 || world_ == 1, "rank ", rank_, ": every image of batch ",
                   position.batch_in_epoch, " was unreadable; with several ranks a rank cannot "
                   "skip a step (the others would wait for it)");
      if (batch->size() == 0) {  // every image of it was skipped as unreadable
        ++position.batch_in_epoch;
        continue;
      }
      lr = schedule.lr(position.step);
      optim::set_lr(optimizer, lr);
      const auto& inputs = batch->inputs;  // on device_ already
      const auto& targets = batch->targets;
      // --cuda-graph: copy in and replay; otherwise the step itself.
      auto out = graphed ? graphed->run(inputs, targets) : step(inputs, targets, optimizer, counters);
      const auto& logits = out.logits;
      const auto& loss = out.loss;

      int64_t n = batch->size() * world_;  // every rank's batch has this rank's size
      loss_sum += loss.detach().to(torch::kFloat64) * batch->size();
      correct += logits.detach().argmax(1).eq(targets).sum();
      position.epoch_seen += n;
      images_this_run += n;
      ++position.batch_in_epoch;
      ++position.step;
      stop = o.max_steps > 0 && position.step >= o.max_steps;
      bool last = position.batch_in_epoch == steps_per_epoch;
      if (checkpointer && o.checkpoint_every > 0 && position.step % o.checkpoint_every == 0 && !last && !stop) {
        sync_sums();
        save();
      }
      if (position.batch_in_epoch % 10 == 0 || last) sync_sums();  // on every rank
      if (progress && (position.batch_in_epoch % 10 == 0 || last)) {
        progress->update(position.batch_in_epoch, images_this_run,
                         format("loss %.4f  lr %.4g", position.epoch_loss_sum / position.epoch_seen, lr));
      }
      if (stop) break;
    }
    batches.reset();
    sync_sums();
    double train_seconds = epoch_clock.seconds();
    if (progress) progress->freeze();

    EpochMetrics m;
    m.epoch = position.epoch + 1;
    m.step = position.step;
    m.train_loss = position.epoch_seen ? position.epoch_loss_sum / position.epoch_seen : 0.0;
    m.train_acc = position.epoch_seen ? double(position.epoch_correct) / position.epoch_seen : 0.0;
    if (data_.test) {
      Forward forward;
      if (pipeline_) {
        forward = [this](const torch::Tensor& x) {
          // Autocast on every kind of device the stages are on (the whole
          // batch goes through the stages in this thread).
          optim::AutocastGuard cpu(torch::kCPU, amp_);
          optim::AutocastGuard cuda(torch::kCUDA, amp_);
          return pipeline_->forward(x);
        };
      } else if (amp_ || o.channels_last) {
        forward = [this](const torch::Tensor& x) {
          optim::AutocastGuard autocast(device_.type(), amp_);
          bool nhwc = options_.channels_last && x.dim() == 4;
          return model_->forward(nhwc ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x);
        };
      }
      auto eval = evaluate(model_, *data_.test, o.batch_size / world_, device_, o.workers,
                           group_.get(), forward);
      m.test_loss = eval.loss;
      m.test_acc = eval.accuracy;
    } else {
      m.evaluated = false;
    }
    report_warnings();
    if (scaler_) {
      say(format("fp16 loss scale %g after this epoch; %lld step(s) skipped for inf/NaN gradients",
                 scaler_->get_scale(), static_cast<long long>(counters.skipped_steps)));
    }
    if (counters.pipeline_steps > 0) {  // the measured bubble against the textbook one
      std::string shares;
      for (double idle : counters.stage_idle) {
        shares += format("%s%.2f", shares.empty() ? "" : " / ", idle / counters.pipeline_steps);
      }
      auto p = static_cast<double>(counters.stage_idle.size());
      auto m_ = static_cast<double>(o.micro_batches);
      say(format("pipeline: stage idle share %s (mean over %lld steps; (p-1)/(m+p-1) = %.2f)",
                 shares.c_str(), static_cast<long long>(counters.pipeline_steps), (p - 1) / (m_ + p - 1)));
    }
    m.epoch_seconds = train_seconds;
    m.images_per_second = train_seconds > 0 ? images_this_run / train_seconds : 0.0;
    m.lr = lr;
    m.world_size = world_;
    m.partial = position.batch_in_epoch < steps_per_epoch;
    if (progress) {
      progress->finish(position.batch_in_epoch, images_this_run,
                       m.evaluated ? format("loss %.4f  test loss %.4f  test acc %.2f%%",
                                            m.train_loss, m.test_loss, 100 * m.test_acc)
                                   : format("loss %.4f", m.train_loss));
    }
    if (metrics.enabled()) metrics.write(m);
    result.epochs.push_back(m);

    if (!m.partial) {  // the next position is the start of the next epoch
      position.batch_in_epoch = 0;
      position.epoch_loss_sum = 0.0;
      position.epoch_correct = 0;
      position.epoch_seen = 0;
      ++position.epoch;
      save();
      --position.epoch;  // the for loop advances it
    } else {
      save();
    }
  }

  // --- Finish ----------------------------------------------------------------
  // "{rank}" in the name: every rank writes its own copy (to compare them).
  const auto rank_field = o.export_weights.find("{rank}");
  if (!o.export_weights.empty() && (rank_ == 0 || rank_field != std::string::npos)) {
    std::string path = o.export_weights;
    if (rank_field != std::string::npos) path.replace(rank_field, 6, std::to_string(rank_));
    NamedTensors tensors;
    for (const auto& p : model_->named_parameters()) tensors.emplace_back(p.key(), p.value());
    for (const auto& b : model_->named_buffers()) tensors.emplace_back(b.key(), b.value());
    write_safetensors(path, tensors, {{"format", "pt"}, {"producer", "tandem"}, {"model", o.model}});
    say("weights written to " + path);
  }
  if (graphed) {
    result.graph_replays = graphed->replays();
    result.graph_eager_steps = graphed->eager_steps();
    say(format("CUDA graph: %lld step(s) replayed, %lld run eagerly",
               static_cast<long long>(result.graph_replays), static_cast<long long>(result.graph_eager_steps)));
  }
  result.steps = position.step;
  result.seconds = run_clock.seconds();
  return result;
}

}  // namespace tandem::engine
