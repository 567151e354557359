// A run's checkpoints: where it starts (Trainer::open_checkpoints:
// --checkpoint-dir opened, and --resume, or a launcher's restart, resumed
// from its newest good checkpoint, whatever the layout that wrote it), and
// each checkpoint it writes (Trainer::save).
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include "tandem/optim/state_tensors.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/table.h"
#include "trainer_run.h"

namespace tandem::engine {

Trainer::Resumption Trainer::open_checkpoints(torch::optim::Optimizer& optimizer) {
  const auto& o = options_;
  Resumption r;
  auto& checkpointer = r.checkpointer;
  auto& position = r.position;
  auto& started_from = r.started_from;
  auto& resume = r.resume;
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
    checkpointer.emplace(checkpoint::CheckpointOptions{o.checkpoint_dir, 2, {"world", "samples", "micro_batches"}});
    if (rank_ == 0) {
      checkpointer->check_writable();  // rank 0 writes them: now, not after an epoch
      checkpointer->lock();            // and alone: a second run on the directory is refused
      for (const auto& name : checkpointer->remove_stale_temporaries()) {
        warn("removed " + name + " from --checkpoint-dir: a checkpoint its process did not finish writing");
      }
    }
  }
  started_from = o.init_weights.empty() ? "" : "--init-weights " + o.init_weights;  // Note [diverged]
  // A worker restarted by the launcher (--max-restarts) resumes by itself.
  resume = o.resume;
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
    const auto path = checkpointer->load_newest_good(
        position,
        [&](const std::string& from) {
          std::error_code ec;
          return std::filesystem::is_directory(from, ec) ? load_held(*checkpointer, from, optimizer)
                                                          : load_whole(*checkpointer, from, optimizer);
        },
        &damaged);
    for (const auto& line : damaged) {
      if (log_) std::fprintf(log_, "tandem: warning: %s\n", line.c_str());
    }
    if (path) {
      started_from = "the checkpoint " + *path;
      // The same --data text may name a data set that changed since: the
      // checkpoint's place in its epoch would then point at other samples.
      const auto samples = checkpoint::fingerprint_field(position.fingerprint, "samples");
      TANDEM_CHECK(!samples || *samples == std::to_string(data_.train->size()), "cannot resume from ", *path,
                   ": it was written by a run on ", samples.value_or(""), " training samples, but --data ", o.data,
                   " now has ", data_.train->size(), ": the data set changed since; resume on the data it was "
                   "written with, or train from the beginning in a new --checkpoint-dir");
      // Note [micro-batches on resume]: another --micro-batches gives the
      // same sums to rounding, except that BatchNorm normalises each
      // micro-batch on its own: a model with BatchNorm then continues on
      // other arithmetic than the uninterrupted run (a sweep measured up to
      // 0.6 relative in convnet's weights), which is said.
      const auto micro_batches = checkpoint::fingerprint_field(position.fingerprint, "micro_batches");
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
      auto written_by = checkpoint::fingerprint_field(position.fingerprint, "world");
      if (written_by && *written_by != std::to_string(world_)) {
        say(format("the checkpoint was written by a run of %s data-parallel rank(s); resuming on %lld "
                   "(Note [resuming on another world size])",
                   written_by->c_str(), static_cast<long long>(world_)));
      }
      if (scaler_ && position.loss_scale > 0) {
        scaler_->load_state(position.loss_scale, position.scale_growth_tracker);
      }
      notice(position.epoch < o.epochs
                 ? format("resumed from %s (epoch %lld, step %lld)", path->c_str(),
                          static_cast<long long>(position.epoch + 1), static_cast<long long>(position.step))
                 : format("resumed from %s (step %lld, after the last epoch)", path->c_str(),
                          static_cast<long long>(position.step)));
      if (!o.init_weights.empty()) {  // read and checked at set-up, now replaced: said, not silent
        notice("--init-weights " + o.init_weights + " is not used: the checkpoint's weights replace it");
      }
    } else {
      warn("no checkpoint in " + o.checkpoint_dir + " to resume from: starting from the beginning");
    }
  }
  return r;
}

checkpoint::TrainPosition Trainer::load_held(const checkpoint::Checkpointer& checkpointer, const std::string& dir,
                                             torch::optim::Optimizer& optimizer) {
  auto held = state_pieces(optimizer, StateUse::kRead);
  std::set<std::string> weights;
  for (const auto& p : model_->named_parameters()) weights.insert(p.key());
  auto loaded = checkpointer.load_held(dir, held.pieces, fingerprint(), weights);
  for (auto& write_back : held.write_backs) write_back();
  for (const auto& name : loaded.absent) {
    TANDEM_CHECK(name.rfind("optimizer.", 0) == 0, "cannot resume from ", dir, ": it holds no ", name.substr(6),
                 ", which this run's model has");
  }
  // A parameter's state is all there or none of it (none: not stepped yet).
  for (auto& fresh : held.state) {
    const auto missing = std::count_if(fresh.names.begin(), fresh.names.end(),
                                       [&](const std::string& name) { return loaded.absent.count(name) > 0; });
    if (missing == static_cast<int64_t>(fresh.names.size())) {
      optimizer.state().erase(fresh.parameter.unsafeGetTensorImpl());
      continue;
    }
    TANDEM_CHECK(missing == 0, "cannot resume from ", dir, ": it holds part of ",
                 fresh.names.front().substr(0, fresh.names.front().rfind('.')), "'s optimizer state, not all of it");
    optim::set_parameter_state(optimizer, fresh.parameter, fresh.state);
  }
  // The options of the step it was written at: its learning rate.
  const auto lr = loaded.header.find("lr");
  if (lr != loaded.header.end()) {
    for (auto& group : optimizer.param_groups()) group.options().set_lr(lr->second.toDouble());
  }
  return loaded.position;
}

checkpoint::TrainPosition Trainer::load_whole(const checkpoint::Checkpointer& checkpointer, const std::string& file,
                                              torch::optim::Optimizer& optimizer) {
  // FSDP: the whole model is loaded on every rank, then each keeps its
  // shards (write-back); the optimizer keeps its slices (FsdpState::load).
  Held full = plan_->whole_model(/*write_back=*/true);
  // Tensor parallelism: the whole model loaded, then each rank's part
  // kept (Note [tensor-parallel checkpoints]).
  mesh_.make_whole(&optimizer);
  // Note [fsdp x pipeline checkpoints]; under tp too.
  const bool sharded = mesh_.splits_model() && dynamic_cast<parallel::FsdpState*>(&optimizer) != nullptr;
  auto whole = sharded ? whole_model_optimizer(optimizer, /*with_state=*/false) : nullptr;
  auto* into = whole ? whole.get() : &optimizer;
  checkpoint::TrainPosition position;
  try {
    position = checkpointer.load(file, *model_, *into, fingerprint());
  } catch (...) {
    mesh_.cut_again(into);
    throw;
  }
  mesh_.cut_again(into);
  if (whole) {
    keep_shards_of(*whole, optimizer);
  } else {
    mesh_.drop_others_state(optimizer);
  }
  return position;
}

void Trainer::save(RunState& run) {
  auto& position = run.position();
  auto& checkpointer = run.start.checkpointer;
  auto& optimizer = *run.optimizer;
  if (scaler_) {
    position.loss_scale = scaler_->get_scale();
    position.scale_growth_tracker = scaler_->growth_tracker();
  }
  if (!checkpointer) return;
  auto& written = run.result.last_checkpoint;
  if (sharded_checkpoints()) {  // Note [sharded checkpoints]: each rank what it owns, no gathering
    written = checkpointer->save_sharded(position, state_pieces(optimizer, StateUse::kWrite).pieces, optimizer, fingerprint(),
                                         weights_metadata(), mesh_.groups.job.get(), device_);
    return;
  }
  if (mesh_.splits_model() && run.fsdp_state) {  // Note [fsdp x pipeline checkpoints]; under tp too
    Held full = plan_->whole_model(/*write_back=*/false);  // the shapes, for AdamW's groups
    auto whole = whole_model_optimizer(optimizer, /*with_state=*/true);
    mesh_.make_whole(whole.get());  // Note [tensor-parallel checkpoints]
    mesh_.gather_stages(*model_, whole.get());
    if (rank_ == 0) written = checkpointer->save(position, *model_, *whole, fingerprint(), weights_metadata());
    mesh_.cut_again(nullptr);
    return;
  }
  // A checkpoint holds the whole optimizer state: every rank gathers the
  // sharded momentum before rank 0 writes it (a collective).
  if (run.zero) run.zero->consolidate_state();
  mesh_.make_whole(&optimizer);  // Note [tensor-parallel checkpoints]
  mesh_.gather_stages(*model_, &optimizer);  // a pipeline over ranks: every stage's weights and momentum
  if (run.fsdp_state) run.fsdp_state->consolidate_state();
  {
    Held full = plan_->whole_model(/*write_back=*/false);  // FSDP: the whole model on every rank
    if (rank_ == 0) written = checkpointer->save(position, *model_, optimizer, fingerprint(), weights_metadata());
  }
  mesh_.cut_again(&optimizer);
  if (run.zero) run.zero->shard_state();
  mesh_.drop_others_state(optimizer);
}

}  // namespace tandem::engine
