// The training loop, run() (trainer.h), as its phases: the set-up here,
// one epoch in trainer_epoch.cpp, checkpoints in trainer_resume.cpp, the
// end here. The Trainer's own set-up is in trainer_setup.cpp, one step and
// evaluation in trainer_step.cpp, the run's account in trainer_account.cpp.
#include "tandem/engine/trainer.h"

#include "tandem/engine/counting_allocator.h"

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <tuple>

#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/optim/adamw.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "trainer_internal.h"
#include "trainer_run.h"

namespace tandem::engine {

TrainResult Trainer::run() {
  auto run = prepare_run();  // loader, optimizer, schedule, checkpoints and resumption, records
  for (auto& position = run->position(); position.epoch < options_.epochs && !run->stop; ++position.epoch) {
    train_epoch(*run);  // the steps, then evaluation, the epoch's record and its checkpoint
  }
  return finish_run(*run);  // the trace, the whole weights on every rank, the export
}

std::unique_ptr<Trainer::RunState> Trainer::prepare_run() {
  const auto& o = options_;
  auto run = std::make_unique<RunState>();

  // Each rank takes its DistributedSampler share, batch-size / world a step:
  // together the ranks' k-th batches are the single-process k-th batch.
  std::shared_ptr<const data::Sampler> sampler;
  if (world_ > 1) {
    sampler = std::make_shared<data::DistributedSampler>(
        data_.train->size(), data::DistributedSamplerOptions{world_, data_rank_, true, o.seed, false});
  } else {
    sampler = std::make_shared<data::RandomSampler>(data_.train->size(), o.seed);
  }
  run->loader = std::make_unique<data::DataLoader>(data_.train, sampler,
                                                   internal::loader_options(o.batch_size / world_, o.workers, device_));
  const int64_t steps_per_epoch = run->steps_per_epoch = run->loader->num_batches();
  TANDEM_CHECK(steps_per_epoch > 0, o.data, ": no training samples");

  // The optimizer: the data plan's own (FSDP's over the shards), or
  // optim::make_optimizer's over the model, with --shard-optimizer its
  // state sharded over the dp ranks (Note [sharded optimizer state]).
  // A pipeline's other stages' parameters keep their places in a sharded
  // optimizer (a checkpoint holds the whole model) but are stepped by their
  // own ranks.
  const auto elsewhere = mesh_.stepped_elsewhere();
  const auto settings = internal::optimizer_settings(o);
  if ((run->optimizer = plan_->make_optimizer(settings))) {
    run->fsdp_state = dynamic_cast<parallel::FsdpState*>(run->optimizer.get());  // its checkpoints gather the shards
  } else {
    auto built = optim::make_optimizer(settings, model_->named_parameters(),
                                       o.shard_optimizer ? mesh_.groups.data : nullptr,
                                       elsewhere, mesh_.expert_weights());  // Note [expert gradients]
    run->optimizer = std::move(built.optimizer);
    run->zero = built.sharded;
  }
  run->schedule = std::make_unique<optim::CosineSchedule>(optim::CosineOptions{
      o.lr, o.min_lr, o.epochs * steps_per_epoch, static_cast<int64_t>(std::llround(o.warmup_epochs * steps_per_epoch))});

  // The outputs: a path that could not be written fails now, not after
  // the training.
  run->export_path = rank_output_path(o.export_weights, rank_);
  check_train_outputs(o, rank_);  // --export-hf, --metrics-out, ... likewise, whoever launched this rank
  // --checkpoint-dir, and --resume or a launcher's restart (trainer_resume.cpp).
  run->start = open_checkpoints(*run->optimizer);
  mesh_.refresh_copies(*plan_);  // the copies as their owners, resumed or not
  const auto& position = run->position();
  run->record = std::make_unique<RunRecorder>(o, rank_, run->start.resume && position.step > 0 ? position.step : -1);
  // --count-memory: the peak from here on is the training's (parameters,
  // gradients, optimizer state, the steps' activations and buffers), not
  // the set-up's passing copies (a broadcast's flat buffer, a loaded file).
  if (auto* counting = CountingAllocator::installed()) counting->reset_peak();
  if (!run->record->notice().empty()) warn(run->record->notice());

  // Note [diverged]: what the run starts from, for the advice should it diverge.
  auto& divergence = run->divergence;
  divergence.peak_lr = o.lr;
  divergence.weight_decay = o.weight_decay;
  divergence.momentum = o.momentum;
  divergence.nesterov = o.nesterov;
  divergence.start_source = run->start.started_from;
  std::tie(divergence.start_largest, divergence.start_tensor) = largest_magnitude(weights_and_buffers());

  announce(steps_per_epoch, run->zero);
  run->traffic = std::make_unique<StepTraffic>(mesh_.named_groups());

  // --cuda-graph: the plain step, captured after a few eager ones and then
  // replayed (engine/cuda_graph.h); the learning rate is read from a tensor.
  if (o.cuda_graph) {
    auto& optimizer = *run->optimizer;
    auto graph_options = capture_options_for(dynamic_cast<optim::Sgd&>(optimizer));  // SGD only: check_optimizer
    // The counters stay untouched: --cuda-graph means no pipeline and no scaler.
    run->graphed = std::make_unique<CudaGraphStep>(device_, [this, &optimizer](const torch::Tensor& x,
                                                                                const torch::Tensor& y) {
      StepCounters unused;
      return step(x, y, optimizer, unused);
    }, graph_options);
    say(format("CUDA graph: the step is captured after %lld eager steps and replayed (a batch of "
               "another size runs eagerly)", static_cast<long long>(CudaGraphOptions{}.warmup_steps)));
  }

  // --profile-out: a Chrome trace of the steps of --profile-steps.
  if (profiler_->enabled()) {
    say(format("profiling steps %lld to %lld into %s", static_cast<long long>(profiler_->options().first),
               static_cast<long long>(profiler_->options().last - 1), profiler_->path().c_str()));
  }
  // Resumed at --max-steps already (the checkpoint of the run that stopped
  // there): nothing more to train.
  run->stop = o.max_steps > 0 && position.step >= o.max_steps;
  if (run->stop) {
    warn(format("step %lld reached --max-steps %lld already: nothing to train",
                static_cast<long long>(position.step), static_cast<long long>(o.max_steps)));
  }
  return run;
}

TrainResult Trainer::finish_run(RunState& run) {
  const auto& o = options_;
  const auto& position = run.position();
  if (profiler_->enabled()) {
    auto trace = profiler_->finish();  // a window the run stopped inside
    if (!trace.empty()) {
      say("trace written to " + trace);
    } else if (position.step <= profiler_->options().first) {
      warn(format("--profile-steps %s: the run ended at step %lld, before the window: no trace written",
                  o.profile_steps.c_str(), static_cast<long long>(position.step)));
    }
  }
  // FSDP ends here: every rank's model holds the whole trained weights
  // again (for the export below, and for evaluate() or model() after run()).
  plan_->finish();
  // Tensor parallelism likewise: every rank's model whole and plain again.
  mesh_.finish();
  // A pipeline over ranks: likewise, every rank's model gets every stage's
  // weights (a collective, so before the rank 0 test below).
  if (!o.export_weights.empty() || !o.export_hf.empty()) mesh_.gather_for_export(*model_, run.optimizer.get());
  // "{rank}" in the name: every rank writes its own copy (to compare them).
  checkpoint::NamedTensors tensors;
  for (const auto& p : model_->named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : model_->named_buffers()) tensors.emplace_back(b.key(), b.value());
  try {
    if (!run.export_path.empty()) {
      checkpoint::write_safetensors(run.export_path, tensors, weights_metadata());
      say("weights written to " + run.export_path);
    }
    // --export-hf: the folder AutoModelForCausalLM.from_pretrained loads.
    if (!o.export_hf.empty() && rank_ == 0) {
      checkpoint::write_hf_folder(o.export_hf, model_, o.model, data_.train->info().num_classes, weights_metadata(),
                                  o.dropout, o.export_hf_shard_gb * 1e9);
      say("transformers folder written to " + o.export_hf);
    }
  } catch (const Error& e) {
    TANDEM_FAIL(e.what(), "; ", keep_trained_weights(run.result.last_checkpoint, tensors));
  }
  auto& result = run.result;
  if (run.graphed) {
    result.graph_replays = run.graphed->replays();
    result.graph_eager_steps = run.graphed->eager_steps();
    say(format("CUDA graph: %lld step(s) replayed, %lld run eagerly",
               static_cast<long long>(result.graph_replays), static_cast<long long>(result.graph_eager_steps)));
  }
  result.steps = position.step;
  result.seconds = run.clock.seconds();
  return result;
}

// Note [trained weights are never lost]: the outputs written after the
// last step (--export-weights, --export-hf) are checked before the first,
// but a disk can fill or a folder go in between. The run's weights are then
// not lost with the error: the last checkpoint holds them, or, without
// --checkpoint-dir, they are written to tandem-weights-PID.safetensors in
// the working folder (else the temporary one), and the error says where.
std::string Trainer::keep_trained_weights(const std::string& checkpoint,
                                          const checkpoint::NamedTensors& tensors) const {
  if (!checkpoint.empty()) {
    return "the trained weights are in the checkpoint " + checkpoint + " (tandem export --checkpoint " +
           options_.checkpoint_dir + " --out FILE writes them)";
  }
  std::string tried;
  for (const auto& folder : {std::filesystem::path("."), std::filesystem::temp_directory_path()}) {
    const auto path = (folder / format("tandem-weights-%d.safetensors", static_cast<int>(::getpid()))).string();
    try {
      checkpoint::write_safetensors(path, tensors, weights_metadata());
      return "the trained weights were written to " + path + " instead";
    } catch (const Error& e) {
      tried += (tried.empty() ? "" : "; ") + std::string(e.what());
    }
  }
  return "and the trained weights could not be written elsewhere either (" + tried + ")";
}

std::vector<std::pair<std::string, torch::Tensor>> Trainer::weights_and_buffers() const {
  std::vector<std::pair<std::string, torch::Tensor>> named;
  for (const auto& t : plan_->placed_parameters()) named.emplace_back(t.name, t.value());
  for (const auto& b : model_->named_buffers()) named.emplace_back(b.key(), b.value());
  return named;
}

void Trainer::diverged(RunState& run, const std::string& what, const std::string& when, double lr) const {
  run.divergence.lr = lr;
  TANDEM_FAIL("training diverged: ", what, " ", when, "; stopped",
              run.start.checkpointer ? " before writing a checkpoint of it" : "", ": ",
              divergence_advice(run.divergence));
}

bool Trainer::sharded_checkpoints() const {
  const auto format = options_.checkpoint_format;
  return format == CheckpointFormat::kSharded ||
         (format == CheckpointFormat::kAuto && mesh_.groups.job && mesh_.groups.job->size() > 1);
}

}  // namespace tandem::engine
