// The training loop, run() (trainer.h). The set-up is in trainer_setup.cpp,
// one step and evaluation in trainer_step.cpp, the run's account of its
// layout in trainer_account.cpp.
#include "tandem/engine/trainer.h"

#include "trainer_internal.h"

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
                          internal::loader_options(o.batch_size / world_, o.workers, device_));
  const int64_t steps_per_epoch = loader.num_batches();
  TANDEM_CHECK(steps_per_epoch > 0, o.data, ": no training samples");
  const auto sgd_options =
      torch::optim::SGDOptions(o.lr).momentum(o.momentum).nesterov(o.nesterov).weight_decay(o.weight_decay);
  // --shard-optimizer: each rank keeps the momentum of its share only (Note
  // [sharded optimizer state]); the weights are plain SGD's.
  std::unique_ptr<optim::Sgd> sgd;
  optim::ZeroSgd* zero = nullptr;
  if ((sgd = plan_->make_optimizer(sgd_options))) {
    // The plan's own: FSDP's SGD over the shards.
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
  auto* fsdp_sgd = dynamic_cast<parallel::FsdpSgd*>(sgd.get());  // its checkpoints gather the shards
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
  // --checkpoint-dir, and --resume or a launcher's restart (trainer_resume.cpp).
  // (References, not structured bindings: lambdas below capture them.)
  auto start = open_checkpoints(optimizer);
  auto& checkpointer = start.checkpointer;
  auto& position = start.position;
  const bool resume = start.resume;
  const std::string& started_from = start.started_from;
  RunRecorder record(o, rank_, resume && position.step > 0 ? position.step : -1);
  if (!record.notice().empty()) warn(record.notice());

  // Note [diverged]: this rank's weights and buffers, checked at every sync;
  // what the run starts from, for the advice should it diverge.
  auto weights_and_buffers = [this] {
    auto named = plan_->named_parameters();
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

  announce(steps_per_epoch, zero);
  // What the steps send over each dimension, for the epoch's record.
  StepTraffic traffic({{"dp", group_}, {"pp", stages_}});
  auto save = [&] {
    if (scaler_) {
      position.loss_scale = scaler_->get_scale();
      position.scale_growth_tracker = scaler_->growth_tracker();
    }
    if (!checkpointer) return;
    if (sharded_checkpoints()) {  // Note [sharded checkpoints]: each rank what it owns, no gathering
      result.last_checkpoint = checkpointer->save_sharded(position, owned_state(optimizer), optimizer, fingerprint(),
                                                          weights_metadata(), job_group_.get(), device_);
      return;
    }
    if (mesh_ && fsdp_sgd) {  // Note [fsdp x pipeline checkpoints]
      auto whole = whole_model_sgd(*fsdp_sgd, /*with_momentum=*/true);
      Held full = plan_->whole_model(/*write_back=*/false);
      gather_stages(*whole);
      if (rank_ == 0) result.last_checkpoint = checkpointer->save(position, *model_, *whole, fingerprint(), weights_metadata());
      return;
    }
    // A checkpoint holds the whole optimizer state: every rank gathers the
    // sharded momentum before rank 0 writes it (a collective).
    if (zero) zero->consolidate_state();
    gather_stages(optimizer);  // a pipeline over ranks: every stage's weights and momentum
    if (fsdp_sgd) fsdp_sgd->consolidate_state();
    {
      Held full = plan_->whole_model(/*write_back=*/false);  // FSDP: the whole model on every rank
      if (rank_ == 0) result.last_checkpoint = checkpointer->save(position, *model_, optimizer, fingerprint(), weights_metadata());
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
            parallel::simulate(parallel::make_pipeline_schedule(option_name(o.schedule), p, o.micro_batches, v), 1.0, 2.0)
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
  plan_->finish();
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

bool Trainer::sharded_checkpoints() const {
  const auto& format = options_.checkpoint_format;
  return format == "sharded" || (format == "auto" && job_group_ && job_group_->size() > 1);
}

}  // namespace tandem::engine
