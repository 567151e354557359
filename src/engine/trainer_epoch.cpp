// One epoch of run() (trainer.h): its steps with their synced sums and
// checkpoints, then evaluation, the epoch's report and record, and the
// checkpoint at its end.
#include <cmath>
#include <optional>

#include <ATen/record_function.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/source.h"
#include "tandem/engine/counting_allocator.h"
#include "tandem/models/registry.h"
#include "tandem/optim/schedule.h"
#include "tandem/parallel/pipeline_schedule.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "trainer_run.h"

namespace tandem::engine {

void Trainer::train_epoch(RunState& run) {
  const auto& o = options_;
  auto& position = run.position();
  auto& profiler = *profiler_;
  model_->train();
  EpochState epoch;
  if (log_ && o.progress != ProgressMode::kOff) {
    epoch.progress.emplace(ProgressOptions{
        format("epoch %lld/%lld", static_cast<long long>(position.epoch + 1), static_cast<long long>(o.epochs)),
        run.steps_per_epoch, tokens_per_sample_ > 0 ? "seq" : "img", o.progress == ProgressMode::kBar || (o.progress == ProgressMode::kAuto && is_terminal(log_)), 10.0, log_});
  }
  epoch.counters.stage_idle.assign(static_cast<size_t>(stage_plan_->stages()), 0.0);
  epoch.loss_sum = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(device_));
  epoch.correct = torch::zeros({}, torch::TensorOptions().dtype(torch::kInt64).device(device_));
  epoch.synced_step = position.step;
  auto& optimizer = *run.optimizer;
  // Batch k + 1 is copied to the device while step k runs (Note [prefetch stream]).
  std::optional<data::DevicePrefetcher> batches;
  batches.emplace(run.loader->epoch(position.epoch, position.batch_in_epoch),
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
    epoch.lr = run.schedule->lr(position.step);
    optim::set_lr(optimizer, epoch.lr);
    // On device_ already; under context parallelism this rank's part of the sequences.
    const auto inputs = mesh_.cut_sequence(batch->inputs);
    const auto targets = mesh_.cut_sequence(batch->targets);
    if (options_.dropout > 0) seed_dropout(position.step);  // Note [dropout seeds]
    // --cuda-graph: copy in and replay; otherwise the step itself.
    run.traffic->begin();
    auto out = run.graphed ? run.graphed->run(inputs, targets) : step(inputs, targets, optimizer, epoch.counters);
    run.traffic->end();

    // Counted in the task's predictions: a sample's row, or each token of a
    // window (every window holds --seq-len), so that the sums give the loss
    // and accuracy per prediction.
    const int64_t predictions = targets.numel();
    epoch.loss_sum += out.loss.detach().to(epoch.loss_sum.device(), torch::kFloat64) * predictions;
    // Not on a pipeline's first stages: the outputs are the last stage's.
    if (out.logits.defined()) epoch.correct += task_->hits(out.logits.detach(), targets);
    epoch.seen += predictions;  // this rank's; summed over the ranks in sync_sums
    ++position.batch_in_epoch;
    ++position.step;
    if (auto trace = profiler.after_step(position.step); !trace.empty()) say("trace written to " + trace);
    run.stop = o.max_steps > 0 && position.step >= o.max_steps;
    const bool last = position.batch_in_epoch == run.steps_per_epoch;
    if (run.start.checkpointer && o.checkpoint_every > 0 && position.step % o.checkpoint_every == 0 && !last &&
        !run.stop) {
      sync_sums(run, epoch);
      save(run);
    }
    const bool log_now = position.batch_in_epoch % o.log_every == 0 || last;
    if (log_now) sync_sums(run, epoch);  // on every rank
    if (epoch.progress && log_now) {
      epoch.progress->update(position.batch_in_epoch, epoch.images,
                             format("loss %.4f  lr %.4g", position.epoch_loss_sum / position.epoch_seen, epoch.lr));
    }
    if (run.stop) break;
  }
  batches.reset();
  sync_sums(run, epoch);
  if (run.stop || position.epoch + 1 == o.epochs) {
    // The run ends inside --profile-steps' window: the trace ends with its
    // last step, not with the evaluation that follows.
    if (auto trace = profiler.finish(); !trace.empty()) {
      say("trace written to " + trace);
      warn(format("--profile-steps %s: the run ended at step %lld, inside the window: the trace holds steps "
                  "%lld to %lld", o.profile_steps.c_str(), static_cast<long long>(position.step),
                  static_cast<long long>(profiler.options().first), static_cast<long long>(position.step - 1)));
    }
  }
  epoch.train_seconds = epoch.clock.seconds();
  if (epoch.progress) epoch.progress->freeze();

  const observe::EpochMetrics m = end_epoch(run, epoch);
  run.record->epoch(m);
  run.result.epochs.push_back(m);
  if (!m.partial) {  // the next position is the start of the next epoch
    position.batch_in_epoch = 0;
    position.epoch_loss_sum = 0.0;
    position.epoch_correct = 0;
    position.epoch_seen = 0;
    ++position.epoch;
    save(run);
    --position.epoch;  // run()'s loop advances it
  } else {
    save(run);
  }
}

void Trainer::sync_sums(RunState& run, EpochState& epoch) {
  auto& position = run.position();
  auto& divergence = run.divergence;
  // On the device: NCCL takes CUDA tensors only.
  // The images too: with --skip-bad-images the ranks' batches differ in size.
  std::vector<torch::Tensor> checked;
  for (const auto& named : weights_and_buffers()) checked.push_back(named.second);
  auto bad = count_non_finite(checked, epoch.loss_sum.device());
  mesh_.sum_over_model(bad);  // every stage's weights and tp rank's parts: all stop, or none
  auto sums = torch::stack({epoch.loss_sum, epoch.correct.to(torch::kFloat64),
                            torch::full({}, static_cast<double>(epoch.seen), epoch.loss_sum.options()), bad});
  mesh_.reduce_epoch_sums(sums);  // over the dp ranks, then the last stage's (its outputs) to every stage
  sums = sums.cpu();
  ExpertLoad experts;  // every rank takes part, or none (the model decides)
  if (experts_ > 0) {
    const bool first_tp = !mesh_.groups.tensor || mesh_.groups.tensor->rank() == 0;
    experts = take_expert_load(model_, experts_, mesh_.groups.job.get(), first_tp);
  }
  double loss = sums[0].item<double>(), hits = sums[1].item<double>();
  const auto predictions = static_cast<int64_t>(std::llround(sums[2].item<double>()));
  const int64_t images = predictions / std::max<int64_t>(1, tokens_per_sample_);  // samples
  const auto bad_tensors = static_cast<int64_t>(std::llround(sums[3].item<double>()));
  const std::string when = format("between steps %lld and %lld (epoch %lld)", static_cast<long long>(epoch.synced_step),
                                  static_cast<long long>(position.step), static_cast<long long>(position.epoch + 1));
  if (!std::isfinite(loss)) {
    diverged(run, std::string("the loss became ") + (std::isnan(loss) ? "NaN" : loss > 0 ? "+inf" : "-inf"), when,
             epoch.lr);
  }
  if (bad_tensors > 0) {
    const std::string first = first_non_finite(weights_and_buffers());
    diverged(run,
             format("%lld tensor(s) of the weights and buffers came to hold NaN or infinite values%s, the "
                    "loss still finite,", static_cast<long long>(bad_tensors),
                    first.empty() ? "" : (" ('" + first + "' on this rank)").c_str()),
             when, epoch.lr);
  }
  if (predictions > 0) {
    divergence.last_loss = loss / static_cast<double>(predictions);
    if (std::isnan(divergence.first_loss)) divergence.first_loss = divergence.last_loss;
    if (position.step > epoch.synced_step) {
      const double seconds = epoch.interval.seconds();
      run.record->steps({position.step, divergence.last_loss, epoch.lr, seconds > 0 ? images / seconds : 0.0,
                         seconds / static_cast<double>(position.step - epoch.synced_step),
                         scaler_ ? scaler_->get_scale() : 0.0, std::move(experts)});
    }
  }
  epoch.interval.reset();
  epoch.synced_step = position.step;
  position.epoch_loss_sum += loss;
  position.epoch_correct += static_cast<int64_t>(std::llround(hits));
  position.epoch_seen += predictions;
  epoch.images += images;
  epoch.seen = 0;
  epoch.loss_sum.zero_();
  epoch.correct.zero_();
}

observe::EpochMetrics Trainer::end_epoch(RunState& run, EpochState& epoch) {
  const auto& position = run.position();
  observe::EpochMetrics m;
  m.epoch = position.epoch + 1;
  m.step = position.step;
  m.train_loss = position.epoch_seen ? position.epoch_loss_sum / position.epoch_seen : 0.0;
  m.train_acc = position.epoch_seen ? double(position.epoch_correct) / position.epoch_seen : 0.0;
  // --count-memory: the epoch's training steps' peak, read before the
  // evaluation (whose batches are whole, not micro-batches) adds its own.
  auto* counting = CountingAllocator::installed();
  if (counting) m.peak_memory_bytes = counting->peak();
  if (data_.test) {
    auto eval = evaluate();
    if (!std::isfinite(eval.loss)) {  // weights that overflow at evaluation (Note [diverged])
      auto [largest, where] = largest_magnitude(weights_and_buffers());
      diverged(run,
               format("the evaluation after step %lld gave a test loss of %s (the largest weight or buffer "
                      "value on this rank: %g, in '%s')", static_cast<long long>(position.step),
                      std::isnan(eval.loss) ? "NaN" : "inf", largest, where.c_str()),
               format("in epoch %lld", static_cast<long long>(position.epoch + 1)), epoch.lr);
    }
    m.test_loss = eval.loss;
    m.test_acc = eval.accuracy;
  } else {
    m.evaluated = false;
  }
  report_warnings(warnings_log_);
  if (scaler_) {
    say(format("fp16 loss scale %g after this epoch; %lld step(s) skipped for inf/NaN gradients",
               scaler_->get_scale(), static_cast<long long>(epoch.counters.skipped_steps)));
  }
  report_pipeline_idle(epoch.counters);
  m.epoch_seconds = epoch.train_seconds;
  m.images_per_second = epoch.train_seconds > 0 ? epoch.images / epoch.train_seconds : 0.0;
  if (tokens_per_sample_ > 0) {
    m.tokens_per_second = m.images_per_second * double(tokens_per_sample_);
    const double peak = peak_flops();
    if (peak > 0 && flops_per_token_ > 0) m.mfu = m.tokens_per_second * flops_per_token_ / peak;
    m.text = data::data_format(options_.data) == "text" && options_.tokenizer.empty();  // bytes as tokens
  }
  m.lr = epoch.lr;
  m.world_size = job_world_;  // processes in the job
  m.comm_bytes_per_step = run.traffic->per_step();
  if (counting) counting->reset_peak();  // the next epoch's steps counted from here
  run.traffic->reset();
  m.partial = position.batch_in_epoch < run.steps_per_epoch;
  if (epoch.progress) {
    epoch.progress->finish(position.batch_in_epoch, epoch.images,
                           m.evaluated ? format("loss %.4f  test loss %.4f  test acc %.2f%%", m.train_loss,
                                                m.test_loss, 100 * m.test_acc)
                                       : format("loss %.4f", m.train_loss));
  }
  return m;
}

// The measured bubble against the textbook one (a collective over a
// pipeline's ranks: each timed its own stage).
void Trainer::report_pipeline_idle(StepCounters& counters) const {
  const auto& o = options_;
  if (counters.pipeline_steps == 0) return;
  mesh_.sum_over_stages(counters.stage_idle);
  std::string shares;
  for (double idle : counters.stage_idle) shares += format("%s%.2f", shares.empty() ? "" : " / ", idle / counters.pipeline_steps);
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

// Note [dropout seeds]: with --dropout each step's masks come from the
// default generator seeded by (--seed, the step, the pipeline stage), not
// from wherever the run's earlier draws left it. So a resumed run draws
// the uninterrupted run's masks (a checkpoint holds rank 0's generator,
// and a later stage's had moved elsewhere), draws before training (the
// pipeline's measured balance runs forwards) change nothing, and every
// layout with the same stages draws alike: the ranks of a tp group (Note
// [dropout under tp]) and of a dp group, one process and a mesh without
// pp. Stages are seeded apart so that their layers' masks are not the
// same stream again. A layer's masks then depend on the stage it is in and
// the layers before it there, so with --dropout a pipeline is cut by
// parameter count (or --pipeline-split), never by measured time: a resumed
// run whose timings chose another cut would draw other masks.
void Trainer::seed_dropout(int64_t step) const {
  const auto stage = static_cast<uint64_t>(mesh_.stage());
  const uint64_t seed = static_cast<uint64_t>(options_.seed) + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(step + 1) +
                        0xBF58476D1CE4E5B9ull * stage;
  auto held = models::hold_default_generator();  // thread ranks share it (Note [seeded model])
  torch::manual_seed(seed);
}

}  // namespace tandem::engine
