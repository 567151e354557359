// The training loop: run() and one step; evaluation (trainer.h). The
// set-up is in trainer_setup.cpp.
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include <ATen/record_function.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/loader.h"
#include "tandem/dist/collectives.h"
#include "tandem/engine/atomic_file.h"
#include "tandem/engine/checkpoint.h"
#include "tandem/engine/divergence.h"
#include "tandem/engine/profile.h"
#include "tandem/engine/run_record.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/safetensors.h"
#include "tandem/engine/step_traffic.h"
#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/clip.h"
#include "tandem/optim/schedule.h"
#include "tandem/optim/sgd.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/fsdp_sgd.h"
#include "tandem/util/arith.h"
#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/file.h"
#include "tandem/util/progress.h"
#include "tandem/util/stopwatch.h"
#include "tandem/util/table.h"

namespace tandem::engine {

namespace {
data::LoaderOptions loader_options(int64_t batch_size, int64_t workers, const torch::Device& device) {
  data::LoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.pin_memory = device.is_cuda();
  return options;
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
  data::DevicePrefetcher batches(loader.epoch(0), data::PrefetchOptions{device, models::parameter_dtype(*model)});
  auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  int64_t count = 0;
  // Every rank calls `forward` as often as the rank with the most batches
  // (rank 0, whose share is the largest): a forward with collectives in it
  // (FSDP's all-gathers) must not leave a rank waiting for one more call.
  int64_t calls = 0;
  const int64_t ranks = group != nullptr ? group->size() : 1;
  const int64_t most = ceil_div(dataset.size(), ranks);
  const int64_t batches_of_the_most = ceil_div(most, batch_size);
  auto empty_input = [&] {
    const auto info = dataset.info();
    return torch::zeros({0, info.channels, info.height, info.width},
                        torch::TensorOptions().dtype(models::parameter_dtype(*model)).device(device));
  };
  while (auto batch = batches.next()) {
    ++calls;
    if (batch->size() == 0) {  // every image of it was unreadable
      if (forward) forward(empty_input());
      continue;
    }
    const auto& inputs = batch->inputs;
    const auto& targets = batch->targets;
    auto logits = forward ? forward(inputs) : model->forward(inputs);
    if (!logits.defined()) continue;  // the output is another rank's (a pipeline's last stage)
    loss_sum += torch::nn::functional::cross_entropy(
        logits, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
    correct += logits.argmax(1).eq(targets).sum();
    count += batch->size();
  }
  for (; forward && calls < batches_of_the_most; ++calls) forward(empty_input());
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

StepOutputs Trainer::step(const torch::Tensor& inputs, const torch::Tensor& targets,
                          torch::optim::Optimizer& optimizer, StepCounters& counters) {
  RECORD_USER_SCOPE("tandem::step");  // the phases, for --profile-out (engine/profile.h)
  if (ddp_) {
    // Note [gradients are bucket views]: on CPU, letting backward's fresh
    // gradient be copied into the bucket once measured faster than zeroing
    // the bucket and accumulating into it (bench/ddp.sh, bench/results/ddp.md);
    // on CUDA the in-place form saves the memory.
    if (device_.is_cuda()) {
      ddp_->zero_grad();
    } else {
      optimizer.zero_grad();
    }
    ddp_->before_forward();  // BatchNorm statistics from rank 0
  } else if (fsdp_) {
    optimizer.zero_grad();  // the shards' (FSDP broadcasts the buffers in its first forward)
  } else {
    optimizer.zero_grad();  // to none (under --cuda-graph: the captured backward assigns them)
    if (group_) dist::broadcast_buffers(*replica_, *group_);
  }
  StepOutputs out;
  if (pipeline_ || rank_pipeline_) {  // forward and backward, micro-batch by micro-batch
    RECORD_USER_SCOPE("tandem::pipeline");
    // Autocast per micro-batch forward in the stages (PipelineOptions); the
    // fp16 scaler scales each micro-batch's loss before its backward.
    parallel::LossScale scale;
    if (scaler_) scale = [this](const torch::Tensor& loss) { return scaler_->scale(loss); };
    const parallel::PipelineLoss micro_loss = [this](const torch::Tensor& output, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(output, target, loss_options_);
    };
    if (pipeline_) {
      auto micro = pipeline_->train_step(inputs, targets, micro_loss, scale);
      out.logits = micro.output;
      out.loss = micro.loss;
      auto idle = micro.idle_share();
      for (size_t s = 0; s < idle.size(); ++s) counters.stage_idle[s] += idle[s];
    } else {  // this rank's stage (Note [pipeline over ranks])
      // Note [replicated stages]: the micro-batches' gradients accumulate;
      // DDP reduces their sum in after_backward().
      std::optional<parallel::DistributedDataParallel::NoSync> accumulate_only;
      if (ddp_) accumulate_only.emplace(*ddp_);
      auto micro = rank_pipeline_->train_step(inputs, targets, micro_loss, scale);
      out.logits = micro.output;  // on the last stage only
      out.loss = micro.loss;      // on every stage (broadcast from the last)
      counters.stage_idle[stages_->rank()] += micro.idle_share().at(0);
    }
    ++counters.pipeline_steps;
  } else {
    // --grad-accum: the batch in chunks, one forward and backward each. Each
    // chunk's mean loss is weighted by its share of the batch, so the
    // gradients add up to those of the batch's mean loss; DDP all-reduces
    // only in the last chunk's backward.
    const int64_t rows = inputs.size(0);
    const int64_t chunks = std::min(options_.grad_accum, rows);
    // Note [unequal batches]: --skip-bad-images can leave the ranks' batches
    // of different sizes, and the ranks average their gradients. Each rank's
    // mean loss is then weighted by its share of the global batch (rows x
    // world / all rows), so that the average is the gradient of the whole
    // batch's mean loss, as in one process. One all-reduce of a scalar a
    // step, only with --skip-bad-images over several ranks.
    torch::Tensor share;
    if (options_.skip_bad_images && group_ && world_ > 1) {
      auto all_rows = torch::full({}, static_cast<double>(rows),
                                  torch::TensorOptions().dtype(torch::kFloat64).device(group_->wire_device()));
      group_->all_reduce(all_rows).wait();
      share = (static_cast<double>(rows * world_) / all_rows).to(device_);
    }
    auto input_chunks = inputs.tensor_split(chunks), target_chunks = targets.tensor_split(chunks);
    std::vector<torch::Tensor> logits;
    for (int64_t k = 0; k < chunks; ++k) {
      std::optional<parallel::DistributedDataParallel::NoSync> accumulate_only;
      if (ddp_ && k + 1 < chunks) accumulate_only.emplace(*ddp_);
      torch::Tensor loss;
      {
        RECORD_USER_SCOPE("tandem::forward");
        optim::AutocastGuard autocast(device_.type(), amp_);  // forward and loss only
        const auto& x = input_chunks[k];
        logits.push_back(dp_ ? dp_->forward(x) : fsdp_ ? fsdp_->forward(x) : model_->forward(x));
        loss = torch::nn::functional::cross_entropy(logits.back(), target_chunks[k], loss_options_);
        if (chunks > 1) loss = loss * (static_cast<double>(x.size(0)) / static_cast<double>(rows));
      }
      {
        RECORD_USER_SCOPE("tandem::backward");
        auto objective = share.defined() ? loss * share.to(loss.scalar_type()) : loss;
        (scaler_ ? scaler_->scale(objective) : objective).backward();
      }
      out.loss = k == 0 ? loss : out.loss.detach() + loss.detach();
    }
    out.logits = chunks == 1 ? logits.front() : torch::cat(logits);
  }
  {
    RECORD_USER_SCOPE("tandem::reduce");
    if (ddp_) {
      ddp_->after_backward();  // buckets were all-reduced during backward
    } else if (fsdp_) {
      fsdp_->after_backward();  // units were reduce-scattered during backward
    } else if (group_) {
      dist::average_gradients(*replica_, *group_);  // seed 004's all-reduce after backward
    }
  }
  {
    RECORD_USER_SCOPE("tandem::optimizer");
    if (options_.clip_grad_norm > 0) {  // on the averaged, unscaled gradients (the same on every rank)
      if (scaler_) scaler_->unscale(optimizer);
      if (fsdp_) {  // each rank holds a shard of every gradient: the norm over all of them
        optim::clip_grad_norm(fsdp_->parameters(), options_.clip_grad_norm, &fsdp_->group());
      } else if (stages_) {  // each stage holds its pieces' gradients: likewise
        optim::clip_grad_norm(model_->parameters(), options_.clip_grad_norm, stages_.get());
      } else {
        optim::clip_grad_norm(model_->parameters(), options_.clip_grad_norm);
      }
    }
    if (scaler_) {  // unscale; skip the step on inf/NaN (on every rank alike); adjust the scale
      if (!scaler_->step(optimizer)) ++counters.skipped_steps;
      scaler_->update();
    } else {
      optimizer.step();
    }
  }
  return out;
}

EvalResult Trainer::evaluate() {
  TANDEM_CHECK(data_.test, "no evaluation data for ", options_.data, " (give --val-data)");
  Forward forward;
  if (pipeline_) {
    forward = [this](const torch::Tensor& x) {
      // Autocast on every kind of device the stages are on (the whole
      // batch goes through the stages in this thread).
      optim::AutocastGuard cpu(torch::kCPU, amp_);
      optim::AutocastGuard cuda(torch::kCUDA, amp_);
      return pipeline_->forward(x);
    };
  } else if (amp_ || options_.channels_last || (fsdp_ && !fsdp_->detached())) {
    forward = [this](const torch::Tensor& x) {
      optim::AutocastGuard autocast(device_.type(), amp_);
      bool nhwc = options_.channels_last && x.dim() == 4;
      auto input = nhwc ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
      return fsdp_ && !fsdp_->detached() ? fsdp_->forward(input) : model_->forward(input);
    };
  }
  if (rank_pipeline_) {
    // Every stage passes every batch on; the last stage's result is the
    // job's (the others' forward returns no output, and they count nothing).
    forward = [this](const torch::Tensor& x) { return rank_pipeline_->forward(x); };
    auto result = engine::evaluate(model_, *data_.test, options_.batch_size, device_, options_.workers,
                                   nullptr, forward);
    const auto wire = stages_->wire_device();
    auto values = torch::tensor({result.loss, result.accuracy, static_cast<double>(result.count)},
                                torch::kFloat64).to(wire);
    stages_->broadcast(values, stages_->size() - 1).wait();
    values = values.cpu();
    return {values[0].item<double>(), values[1].item<double>(), static_cast<int64_t>(values[2].item<double>())};
  }
  // Note [evaluation buffers]: each rank's BatchNorm statistics moved with
  // its own last batches since rank 0's were broadcast before the last
  // step. The ranks evaluate their shares of the test set with rank 0's, as
  // PyTorch's DDP does (it broadcasts buffers before every forward): the
  // reported score is then that of one model, the one --export-weights
  // writes (rank 0's); each rank's own scored up to 0.1% apart. The next
  // step broadcasts rank 0's before its forward anyway.
  if (group_ && world_ > 1 && !model_->buffers().empty()) dist::broadcast_buffers(*model_, *group_);
  return engine::evaluate(model_, *data_.test, options_.batch_size / world_, device_, options_.workers,
                          group_.get(), forward);
}

void Trainer::say(const std::string& line) const {
  if (log_ && options_.progress != "off") std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::warn(const std::string& line) const {
  if (log_) std::fprintf(log_, "tandem: warning: %s\n", printable(line).c_str());
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
        data_.train->size(), data::DistributedSamplerOptions{world_, data_rank_, true, o.seed, false});
  } else {
    sampler = std::make_shared<data::RandomSampler>(data_.train->size(), o.seed);
  }
  data::DataLoader loader(data_.train, sampler,
                          loader_options(o.batch_size / world_, o.workers, device_));
  const int64_t steps_per_epoch = loader.num_batches();
  TANDEM_CHECK(steps_per_epoch > 0, o.data, ": no training samples");
  const auto sgd_options =
      torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay);
  // --shard-optimizer: each rank keeps the momentum of its share only (Note
  // [sharded optimizer state]); the weights are plain SGD's.
  std::unique_ptr<optim::Sgd> sgd;
  optim::ZeroSgd* zero = nullptr;
  parallel::FsdpSgd* fsdp_sgd = nullptr;  // --strategy fsdp: SGD over the shards
  if (fsdp_) {
    auto sharded = std::make_unique<parallel::FsdpSgd>(*fsdp_, sgd_options);
    fsdp_sgd = sharded.get();
    sgd = std::move(sharded);
  } else if (o.shard_optimizer) {
    // A pipeline's other stages' parameters keep their places (a checkpoint
    // holds the whole model) but are stepped by their own ranks.
    std::vector<torch::Tensor> elsewhere;
    for (const auto& piece : others_pieces_) {
      for (const auto& p : piece->parameters()) elsewhere.push_back(p);
    }
    auto sharded = std::make_unique<optim::ZeroSgd>(model_->parameters(), sgd_options, group_, elsewhere);
    zero = sharded.get();
    sgd = std::move(sharded);
  } else {
    sgd = std::make_unique<optim::Sgd>(model_->parameters(), sgd_options);
  }
  optim::Sgd& optimizer = *sgd;
  optim::CosineSchedule schedule(
      {o.lr, o.min_lr, o.epochs * steps_per_epoch,
       static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch))});

  // --- Resume ----------------------------------------------------------------
  // --export-weights: a path that could not be written fails now, not
  // after the training.
  const std::string export_path = rank_output_path(o.export_weights, rank_);
  if (!export_path.empty()) {
    check_output_file("--export-weights", export_path);
    check_replaceable_file("--export-weights", export_path);
  }
  std::optional<Checkpointer> checkpointer;
  // Note [resuming on another world size]: a checkpoint holds the whole
  // model and optimizer (rank 0's, the same on every rank) and a position
  // counted in global batches, and the ranks' k-th batches together are the
  // single process's k-th batch (DistributedSampler) whatever the world size.
  // So a run may resume on another number of ranks and train on the same
  // batches, as an uninterrupted run would (to rounding; BatchNorm without
  // --sync-bn normalises over each rank's share, which does depend on it).
  // The global batch must stay: with --batch-per-process it changes with the
  // world size, and the fingerprint's batch then refuses the checkpoint.
  if (!o.checkpoint_dir.empty()) {
    checkpointer.emplace(CheckpointOptions{o.checkpoint_dir, 2, {"world", "samples", "micro_batches"}});
    if (rank_ == 0) {
      checkpointer->check_writable();  // rank 0 writes them: now, not after an epoch
      checkpointer->lock();            // and alone: a second run on the directory is refused
      for (const auto& name : checkpointer->remove_stale_temporaries()) {
        warn("removed " + name + " from --checkpoint-dir: a checkpoint its process did not finish writing");
      }
    }
  }
  TrainPosition position;
  std::string started_from = o.init_weights.empty() ? "" : "--init-weights " + o.init_weights;  // Note [diverged]
  // A worker restarted by the launcher (--max-restarts) resumes by itself.
  bool resume = o.resume;
  // tandem launch's count, or torchrun's (Note [agent store]).
  const auto restart = env::get_int("TANDEM_RESTART_COUNT").value_or(env::get_int("TORCHELASTIC_RESTART_COUNT").value_or(0));
  if (!resume && restart > 0) {
    if (checkpointer) {
      resume = true;
      say(format("restart %lld: resuming from the newest checkpoint in %s",
                 static_cast<long long>(restart), o.checkpoint_dir.c_str()));
    } else {
      warn("restarted without --checkpoint-dir: starting from the beginning");
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
    std::optional<std::string> path;
    {
      // FSDP: the whole model is loaded on every rank, then each keeps its
      // shards (write-back); the optimizer keeps its slices (FsdpSgd::load).
      std::optional<parallel::FullyShardedDataParallel::FullParams> full;
      if (fsdp_) full.emplace(*fsdp_, /*write_back=*/true);
      path = checkpointer->load_newest_good(position, *model_, optimizer, fingerprint(), &damaged);
    }
    for (const auto& line : damaged) {
      if (log_) std::fprintf(log_, "tandem: warning: %s\n", line.c_str());
    }
    if (path) {
      started_from = "the checkpoint " + *path;
      // The same --data text may name a data set that changed since: the
      // checkpoint's place in its epoch would then point at other samples.
      const auto samples = fingerprint_field(position.fingerprint, "samples");
      TANDEM_CHECK(!samples || *samples == std::to_string(data_.train->size()), "cannot resume from ", *path,
                   ": it was written by a run on ", samples.value_or(""), " training samples, but --data ", o.data,
                   " now has ", data_.train->size(), ": the data set changed since; resume on the data it was "
                   "written with, or train from the beginning in a new --checkpoint-dir");
      // Note [micro-batches on resume]: another --micro-batches gives the
      // same sums to rounding, except that BatchNorm normalises each
      // micro-batch on its own: a model with BatchNorm then continues on
      // other arithmetic than the uninterrupted run (a sweep measured up to
      // 0.6 relative in convnet's weights), which is said.
      const auto micro_batches = fingerprint_field(position.fingerprint, "micro_batches");
      if (micro_batches && *micro_batches != std::to_string(o.micro_batches)) {
        const auto buffers = model_->named_buffers();
        const bool batch_norm = std::any_of(buffers.begin(), buffers.end(), [](const auto& b) {
          return b.key().size() >= 12 && b.key().compare(b.key().size() - 12, 12, "running_mean") == 0;
        });
        if (batch_norm) {
          warn(format("the checkpoint was written with --micro-batches %s, this run has %lld: %s's BatchNorm "
                      "normalises each micro-batch on its own, so the run goes on with other statistics than "
                      "the one that wrote it would have (resume with --micro-batches %s for the same arithmetic)",
                      micro_batches->c_str(), static_cast<long long>(o.micro_batches), o.model.c_str(),
                      micro_batches->c_str()));
        }
      }
      auto written_by = fingerprint_field(position.fingerprint, "world");
      if (written_by && *written_by != std::to_string(world_)) {
        say(format("the checkpoint was written by a run of %s rank(s); resuming on %lld "
                   "(Note [resuming on another world size])",
                   written_by->c_str(), static_cast<long long>(world_)));
      }
      if (scaler_ && position.loss_scale > 0) {
        scaler_->load_state(position.loss_scale, position.scale_growth_tracker);
      }
      say(position.epoch < o.epochs
              ? format("resumed from %s (epoch %lld, step %lld)", path->c_str(),
                       static_cast<long long>(position.epoch + 1), static_cast<long long>(position.step))
              : format("resumed from %s (step %lld, after the last epoch)", path->c_str(),
                       static_cast<long long>(position.step)));
      if (!o.init_weights.empty()) {  // read and checked at set-up, now replaced: said, not silent
        say("--init-weights " + o.init_weights + " is not used: the checkpoint's weights replace it");
      }
    } else {
      warn("no checkpoint in " + o.checkpoint_dir + " to resume from: starting from the beginning");
    }
  }
  RunRecorder record(o, rank_, resume && position.step > 0 ? position.step : -1);
  if (!record.notice().empty()) warn(record.notice());

  // Note [diverged]: this rank's weights and buffers, checked at every sync;
  // what the run starts from, for the advice should it diverge.
  auto weights_and_buffers = [this] {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    if (fsdp_) {
      for (const auto& shard : fsdp_->parameters()) named.emplace_back("a parameter shard of this rank", shard);
    } else {
      for (const auto& p : model_->named_parameters()) named.emplace_back(p.key(), p.value());
    }
    for (const auto& b : model_->named_buffers()) named.emplace_back(b.key(), b.value());
    return named;
  };
  DivergenceFacts divergence;
  divergence.peak_lr = o.lr;
  divergence.weight_decay = o.weight_decay;
  divergence.momentum = o.momentum;
  divergence.nesterov = o.nesterov;
  divergence.start_source = started_from;
  std::tie(divergence.start_largest, divergence.start_tensor) = largest_magnitude(weights_and_buffers());
  // Ends the run: `what` diverged at `when` (Note [diverged]).
  auto diverged = [&](const std::string& what, const std::string& when, double lr) {
    divergence.lr = lr;
    TANDEM_FAIL("training diverged: ", what, " ", when, "; stopped",
                checkpointer ? " before writing a checkpoint of it" : "", ": ", divergence_advice(divergence));
  };

  if (!data_.test) warn("no evaluation data for " + o.data + " (give --val-data): evaluation skipped");
  if (mesh_) {
    say(format("device mesh %s over %lld ranks: %lld pipeline(s) of %lld stages, each stage replicated over "
               "its %lld dp ranks (Note [replicated stages])",
               layout_.mesh.str().c_str(), static_cast<long long>(job_world_),
               static_cast<long long>(layout_.data_ranks()), static_cast<long long>(layout_.pipeline_ranks()),
               static_cast<long long>(layout_.data_ranks())));
  }
  if (world_ > 1) {
    say(format("data parallel over %lld ranks (%s, %s): batch %lld per rank, %lld in all",
               static_cast<long long>(world_), ddp_ ? "ddp" : fsdp_ ? "fsdp" : "allreduce",
               group_->backend().c_str(), static_cast<long long>(o.batch_size / world_),
               static_cast<long long>(o.batch_size)));
  }
  if (fsdp_) {
    int64_t largest = 0, shards = 0;
    for (const auto& unit : fsdp_->units()) largest = std::max(largest, unit.numel);
    for (const auto& shard : fsdp_->parameters()) shards += shard.numel();
    const double mib = static_cast<double>(torch::elementSize(models::parameter_dtype(*model_))) / (1 << 20);
    say(format("fully sharded (FSDP, %s): %lld unit(s) of up to %lld parameters, gathered one at a time "
               "(%s); each rank keeps %.2f MiB of parameters (as much of gradients and momentum) instead of %.2f",
               o.fsdp_sharding == "full" ? "ZeRO-3: parameters gathered again for backward"
                                         : "ZeRO-2: parameters kept from forward to backward",
               static_cast<long long>(fsdp_->units().size()), static_cast<long long>(largest),
               fsdp_->describe_units().c_str(), shards * mib, parameter_count_ * mib));
  } else if (o.strategy == "fsdp") {
    warn("--strategy fsdp in one process: nothing to shard over, training as one process does");
  }
  if (!group_ && !stages_) {
    // One process, started without a launcher: the flags that act over
    // ranks have none (a sweep found them accepted without a word).
    const TrainOptions defaults;
    std::vector<std::string> idle;
    if (o.strategy == "ddp" || o.strategy == "allreduce") idle.push_back("--strategy " + o.strategy);
    if (o.shard_optimizer) idle.push_back("--shard-optimizer");
    if (o.sync_bn) idle.push_back("--sync-bn");
    if (o.ddp_comm_hook != defaults.ddp_comm_hook) idle.push_back("--ddp-comm-hook " + o.ddp_comm_hook);
    if (o.bucket_cap_mb != defaults.bucket_cap_mb) idle.push_back(format("--bucket-cap-mb %g", o.bucket_cap_mb));
    if (o.dist_backend != defaults.dist_backend) idle.push_back("--dist-backend " + o.dist_backend);
    if (o.dist_timeout != defaults.dist_timeout) idle.push_back(format("--dist-timeout %g", o.dist_timeout));
    if (!idle.empty()) {
      std::string flags;
      for (const auto& flag : idle) flags += (flags.empty() ? "" : ", ") + flag;
      warn(flags + ": one process, no ranks to act over; training as one process does (--nproc-per-node N "
                   "starts N)");
    }
  }
  if (o.channels_last) {
    const auto params = model_->parameters();
    if (std::none_of(params.begin(), params.end(), [](const torch::Tensor& p) { return p.dim() == 4; })) {
      warn("--channels-last: " + o.model + " has no 4-D weights (no convolutions); nothing changes");
    }
  }
  if (o.batch_size > data_.train->size()) {
    warn(format("--batch-size %lld is more than the %lld training images: each step takes all of them",
                static_cast<long long>(o.batch_size), static_cast<long long>(data_.train->size())));
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
  if (o.checkpoint_activations > 0 && pipeline_) {
    say("activation checkpointing: every stage keeps only its micro-batches' inputs and recomputes "
        "its forward before their backward (GPipe's re-materialization)");
  } else if (o.checkpoint_activations > 0 && fsdp_) {
    say("activation checkpointing: every FSDP unit but the last keeps only its input and recomputes "
        "its forward in backward (the unit is gathered for its backward anyway)");
  } else if (o.checkpoint_activations > 0 && o.strategy == "fsdp") {
    warn("activation checkpointing: --strategy fsdp recomputes its units, and one process has none: off");
  } else if (o.checkpoint_activations > 0) {
    std::string sizes;
    for (auto n : model_->checkpointed_segments()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
    say(format("activation checkpointing: the top-level layers in segments of %s; all but the last "
               "recomputed in backward", sizes.c_str()));
  }
  if (zero) {
    auto shares = zero->shard_numels();
    int64_t whole = 0;
    for (auto n : shares) whole += n;
    const double bytes = static_cast<double>(torch::elementSize(models::parameter_dtype(*model_)));
    say(format("optimizer state sharded over %lld rank(s) (ZeRO-1): momentum of %.2f to %.2f MiB a rank "
               "instead of %.2f", static_cast<long long>(shares.size()),
               o.momentum > 0 ? *std::min_element(shares.begin(), shares.end()) * bytes / (1 << 20) : 0.0,
               o.momentum > 0 ? *std::max_element(shares.begin(), shares.end()) * bytes / (1 << 20) : 0.0,
               o.momentum > 0 ? whole * bytes / (1 << 20) : 0.0));
  }
  if (amp_) {
    say(amp_ == torch::kHalf
            ? "mixed precision: fp16 autocast with dynamic loss scaling (initial scale 65536)"
            : "mixed precision: bf16 autocast");
  }
  // Interleaved: " (2 chunks per rank: rank r runs stages r, r + 2, ...)".
  auto chunks_note = [&](const char* holder, int64_t holders) {
    if (virtual_stages() <= 1) return std::string();
    return format(" (%lld chunks per %s: %s %c runs stages %c, %c + %lld, ...)",
                  static_cast<long long>(virtual_stages()), holder, holder, holder[0], holder[0], holder[0],
                  static_cast<long long>(holders));
  };
  if (rank_pipeline_) {
    say(format("pipeline over %lld ranks, one stage per rank on its device (rank 0: %s): stages %s; "
               "%lld micro-batches, %s schedule%s",
               static_cast<long long>(stages_->size()), device_.str().c_str(), pipeline_split_.c_str(),
               static_cast<long long>(o.micro_batches), o.schedule.c_str(),
               chunks_note("rank", stages_->size()).c_str()));
  }
  if (pipeline_) {
    std::string names;
    for (const auto& d : pipeline_->devices()) names += (names.empty() ? "" : ",") + d.str();
    say(format("pipeline over %s in one process: stages %s; %lld micro-batches, %s schedule%s",
               names.c_str(), pipeline_split_.c_str(), static_cast<long long>(o.micro_batches),
               o.schedule.c_str(),
               chunks_note("device", static_cast<int64_t>(pipeline_->devices().size())).c_str()));
  }
  say(format("training %s (%lld parameters) on %s, %lld steps/epoch, device %s",
             o.model.c_str(), static_cast<long long>(parameter_count_),
             data_.train->describe().c_str(), static_cast<long long>(steps_per_epoch),
             device_.str().c_str()));
  // What the steps send over each dimension, for the epoch's record.
  StepTraffic traffic({{"dp", group_}, {"pp", stages_}});
  auto save = [&] {
    if (scaler_) {
      position.loss_scale = scaler_->get_scale();
      position.scale_growth_tracker = scaler_->growth_tracker();
    }
    if (!checkpointer) return;
    // A checkpoint holds the whole optimizer state: every rank gathers the
    // sharded momentum before rank 0 writes it (a collective).
    if (zero) zero->consolidate_state();
    gather_stages(optimizer);  // a pipeline over ranks: every stage's weights and momentum
    if (fsdp_sgd) fsdp_sgd->consolidate_state();
    {
      std::optional<parallel::FullyShardedDataParallel::FullParams> full;  // the whole model on every rank
      if (fsdp_) full.emplace(*fsdp_, /*write_back=*/false);
      if (rank_ == 0) result.last_checkpoint = checkpointer->save(position, *model_, optimizer, fingerprint());
    }
    if (zero) zero->shard_state();
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

  // --profile-out: a Chrome trace of the steps of --profile-steps.
  auto& profiler = *profiler_;
  const auto& profile_options = profiler.options();
  if (profiler.enabled()) {
    say(format("profiling steps %lld to %lld into %s", static_cast<long long>(profile_options.first),
               static_cast<long long>(profile_options.last - 1), profiler.path().c_str()));
  }

  // --- Epochs ----------------------------------------------------------------
  // Resumed at --max-steps already (the checkpoint of the run that stopped
  // there): nothing more to train.
  bool stop = o.max_steps > 0 && position.step >= o.max_steps;
  if (stop) {
    warn(format("step %lld reached --max-steps %lld already: nothing to train",
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
    counters.stage_idle.assign(pipeline_ ? pipeline_->devices().size() : stages_ ? stages_->size() : 0, 0.0);
    double lr = 0.0;
    auto loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
    auto correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
    int64_t seen = 0;  // this rank's images since the last sync_sums
    int64_t synced_step = position.step;  // the step of the last sync_sums, whose sums were finite
    Stopwatch interval_clock;             // since the last sync_sums
    // Folds the device-side sums into the position; over all ranks, so every
    // rank calls it at the same steps (Note: a collective). A loss that is no
    // longer finite ends the run on every rank (Note [diverged]).
    auto sync_sums = [&] {
      // On the device: NCCL takes CUDA tensors only.
      // The images too: with --skip-bad-images the ranks' batches differ in size.
      std::vector<torch::Tensor> checked;
      for (const auto& named : weights_and_buffers()) checked.push_back(named.second);
      auto bad = count_non_finite(checked, loss_sum.device());
      if (stages_) stages_->all_reduce(bad).wait();  // every stage's weights; the sums are the last stage's
      auto sums = torch::stack({loss_sum, correct.to(torch::kFloat64),
                                torch::full({}, static_cast<double>(seen), loss_sum.options()), bad});
      if (group_) group_->all_reduce(sums).wait();
      if (stages_) stages_->broadcast(sums, stages_->size() - 1).wait();  // the last stage has the outputs
      sums = sums.cpu();
      double loss = sums[0].item<double>(), hits = sums[1].item<double>();
      const auto images = static_cast<int64_t>(std::llround(sums[2].item<double>()));
      const auto bad_tensors = static_cast<int64_t>(std::llround(sums[3].item<double>()));
      const std::string when = format("between steps %lld and %lld (epoch %lld)", static_cast<long long>(synced_step),
                                      static_cast<long long>(position.step),
                                      static_cast<long long>(position.epoch + 1));
      if (!std::isfinite(loss)) {
        diverged(std::string("the loss became ") + (std::isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf"), when, lr);
      }
      if (bad_tensors > 0) {
        const std::string first = first_non_finite(weights_and_buffers());
        diverged(format("%lld tensor(s) of the weights and buffers came to hold NaN or infinite values%s, the "
                        "loss still finite,", static_cast<long long>(bad_tensors),
                        first.empty() ? "" : (" ('" + first + "' on this rank)").c_str()),
                 when, lr);
      }
      if (images > 0) {
        divergence.last_loss = loss / static_cast<double>(images);
        if (std::isnan(divergence.first_loss)) divergence.first_loss = divergence.last_loss;
        if (position.step > synced_step) {
          const double seconds = interval_clock.seconds();
          record.steps({position.step, divergence.last_loss, lr, seconds > 0 ? images / seconds : 0.0,
                        seconds / static_cast<double>(position.step - synced_step),
                        scaler_ ? scaler_->get_scale() : 0.0});
        }
      }
      interval_clock.reset();
      synced_step = position.step;
      position.epoch_loss_sum += loss;
      position.epoch_correct += static_cast<int64_t>(std::llround(hits));
      position.epoch_seen += images;
      images_this_run += images;
      seen = 0;
      loss_sum.zero_();
      correct.zero_();
    };
    // Batch k + 1 is copied to the device while step k runs (Note [prefetch stream]).
    std::optional<data::DevicePrefetcher> batches;
    batches.emplace(loader.epoch(position.epoch, position.batch_in_epoch),
                    data::PrefetchOptions{device_, models::parameter_dtype(*model_), o.channels_last});
    while (true) {
      std::optional<data::Batch> batch;
      {
        RECORD_USER_SCOPE("tandem::next_batch");
        batch = batches->next();
      }
      if (!batch) break;
      TANDEM_CHECK(batch->size() > 0 || world_ == 1, "rank ", rank_, ": every image of batch ",
                   position.batch_in_epoch, " was unreadable; with several ranks a rank cannot "
                   "skip a step (the others would wait for it)");
      if (batch->size() == 0) {  // every image of it was skipped as unreadable
        ++position.batch_in_epoch;
        continue;
      }
      if (auto trace = profiler.before_step(position.step); !trace.empty()) say("trace written to " + trace);
      lr = schedule.lr(position.step);
      optim::set_lr(optimizer, lr);
      const auto& inputs = batch->inputs;  // on device_ already
      const auto& targets = batch->targets;
      // --cuda-graph: copy in and replay; otherwise the step itself.
      traffic.begin();
      auto out = graphed ? graphed->run(inputs, targets) : step(inputs, targets, optimizer, counters);
      traffic.end();
      const auto& logits = out.logits;
      const auto& loss = out.loss;

      loss_sum += loss.detach().to(loss_sum.device(), torch::kFloat64) * batch->size();
      if (logits.defined()) correct += logits.detach().argmax(1).eq(targets).sum();  // not on a pipeline's first stages
      seen += batch->size();  // this rank's; summed over the ranks in sync_sums
      ++position.batch_in_epoch;
      ++position.step;
      if (auto trace = profiler.after_step(position.step); !trace.empty()) say("trace written to " + trace);
      stop = o.max_steps > 0 && position.step >= o.max_steps;
      bool last = position.batch_in_epoch == steps_per_epoch;
      if (checkpointer && o.checkpoint_every > 0 && position.step % o.checkpoint_every == 0 && !last && !stop) {
        sync_sums();
        save();
      }
      const bool log_now = position.batch_in_epoch % o.log_every == 0 || last;
      if (log_now) sync_sums();  // on every rank
      if (progress && log_now) {
        progress->update(position.batch_in_epoch, images_this_run,
                         format("loss %.4f  lr %.4g", position.epoch_loss_sum / position.epoch_seen, lr));
      }
      if (stop) break;
    }
    batches.reset();
    sync_sums();
    if (stop || position.epoch + 1 == o.epochs) {
      // The run ends inside --profile-steps' window: the trace ends with its
      // last step, not with the evaluation that follows.
      if (auto trace = profiler.finish(); !trace.empty()) {
        say("trace written to " + trace);
        warn(format("--profile-steps %s: the run ended at step %lld, inside the window: the trace holds steps "
                    "%lld to %lld", o.profile_steps.c_str(), static_cast<long long>(position.step),
                    static_cast<long long>(profile_options.first), static_cast<long long>(position.step - 1)));
      }
    }
    double train_seconds = epoch_clock.seconds();
    if (progress) progress->freeze();

    EpochMetrics m;
    m.epoch = position.epoch + 1;
    m.step = position.step;
    m.train_loss = position.epoch_seen ? position.epoch_loss_sum / position.epoch_seen : 0.0;
    m.train_acc = position.epoch_seen ? double(position.epoch_correct) / position.epoch_seen : 0.0;
    if (data_.test) {
      auto eval = evaluate();
      if (!std::isfinite(eval.loss)) {  // weights that overflow at evaluation (Note [diverged])
        auto [largest, where] = largest_magnitude(weights_and_buffers());
        diverged(format("the evaluation after step %lld gave a test loss of %s (the largest weight or buffer "
                        "value on this rank: %g, in '%s')", static_cast<long long>(position.step),
                        std::isnan(eval.loss) ? "NaN" : "inf", largest, where.c_str()),
                 format("in epoch %lld", static_cast<long long>(position.epoch + 1)), lr);
      }
      m.test_loss = eval.loss;
      m.test_acc = eval.accuracy;
    } else {
      m.evaluated = false;
    }
    report_warnings(warnings_log_);
    if (scaler_) {
      say(format("fp16 loss scale %g after this epoch; %lld step(s) skipped for inf/NaN gradients",
                 scaler_->get_scale(), static_cast<long long>(counters.skipped_steps)));
    }
    if (stages_ && counters.pipeline_steps > 0) {  // each rank timed its own stage
      const auto wire = stages_->wire_device();
      auto idle = torch::tensor(counters.stage_idle, torch::kFloat64).to(wire);
      stages_->all_reduce(idle).wait();
      idle = idle.cpu();
      counters.stage_idle.assign(idle.data_ptr<double>(), idle.data_ptr<double>() + idle.numel());
    }
    if (counters.pipeline_steps > 0) {  // the measured bubble against the textbook one
      std::string shares;
      for (double idle : counters.stage_idle) {
        shares += format("%s%.2f", shares.empty() ? "" : " / ", idle / counters.pipeline_steps);
      }
      const auto p = static_cast<int64_t>(counters.stage_idle.size()), v = virtual_stages();
      const double pd = static_cast<double>(p), md = static_cast<double>(o.micro_batches);
      if (v == 1 || o.micro_batches % p == 0) {
        say(format("pipeline: stage idle share %s (mean over %lld steps; %s = %.2f)", shares.c_str(),
                   static_cast<long long>(counters.pipeline_steps), v > 1 ? "(p-1)/(vm+p-1)" : "(p-1)/(m+p-1)",
                   (pd - 1) / (static_cast<double>(v) * md + pd - 1)));
      } else {
        // Interleaved with p not dividing m: no closed form; the schedule's
        // own bubble, simulated with backwards twice as long as forwards.
        const double textbook =
            parallel::simulate(parallel::make_pipeline_schedule(o.schedule, p, o.micro_batches, v), 1.0, 2.0)
                .mean_idle_share();
        say(format("pipeline: stage idle share %s (mean over %lld steps; the schedule's, simulated = %.2f)",
                   shares.c_str(), static_cast<long long>(counters.pipeline_steps), textbook));
      }
    }
    m.epoch_seconds = train_seconds;
    m.images_per_second = train_seconds > 0 ? images_this_run / train_seconds : 0.0;
    m.lr = lr;
    m.world_size = job_world_;  // processes in the job
    m.comm_bytes_per_step = traffic.per_step();
    traffic.reset();
    m.partial = position.batch_in_epoch < steps_per_epoch;
    if (progress) {
      progress->finish(position.batch_in_epoch, images_this_run,
                       m.evaluated ? format("loss %.4f  test loss %.4f  test acc %.2f%%",
                                            m.train_loss, m.test_loss, 100 * m.test_acc)
                                   : format("loss %.4f", m.train_loss));
    }
    record.epoch(m);
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
  if (profiler.enabled()) {
    auto trace = profiler.finish();  // a window the run stopped inside
    if (!trace.empty()) {
      say("trace written to " + trace);
    } else if (position.step <= profile_options.first) {
      warn(format("--profile-steps %s: the run ended at step %lld, before the window: no trace written",
                 o.profile_steps.c_str(), static_cast<long long>(position.step)));
    }
  }
  // FSDP ends here: every rank's model holds the whole trained weights
  // again (for the export below, and for evaluate() or model() after run()).
  if (fsdp_) fsdp_->detach_model();
  // A pipeline over ranks: likewise, every rank's model gets every stage's
  // weights (a collective, so before the rank 0 test below).
  if (stages_ && !o.export_weights.empty()) gather_stages(optimizer);
  // "{rank}" in the name: every rank writes its own copy (to compare them).
  if (!export_path.empty()) {
    const std::string& path = export_path;
    NamedTensors tensors;
    for (const auto& p : model_->named_parameters()) tensors.emplace_back(p.key(), p.value());
    for (const auto& b : model_->named_buffers()) tensors.emplace_back(b.key(), b.value());
    write_safetensors(path, tensors, weights_metadata());
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
