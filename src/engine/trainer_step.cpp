// One training step as the layout says, and evaluation (trainer.h).
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <optional>

#include <ATen/record_function.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/loader.h"
#include "tandem/dist/collectives.h"
#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/clip.h"
#include "tandem/util/arith.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "trainer_internal.h"

namespace tandem::engine {

StepOutputs Trainer::step(const torch::Tensor& inputs, const torch::Tensor& targets,
                          torch::optim::Optimizer& optimizer, StepCounters& counters) {
  RECORD_USER_SCOPE("tandem::step");  // the phases, for --profile-out (engine/profile.h)
  // Note [stage plans]: the data plan begins and reduces, the stage plan
  // runs forward and backward between.
  plan_->begin_step(optimizer);  // gradients cleared, BatchNorm statistics from dp rank 0
  StepOutputs out = stage_plan_->forward_backward(inputs, targets, *plan_, counters.stage_idle);
  if (stage_plan_->stages() > 0) ++counters.pipeline_steps;
  {
    RECORD_USER_SCOPE("tandem::reduce");
    plan_->after_backward();  // the gradients averaged over the dp ranks
    if (tied_) tied_->reduce_gradients();  // Note [tied weights across stages]
  }
  {
    RECORD_USER_SCOPE("tandem::optimizer");
    if (options_.clip_grad_norm > 0) {  // on the averaged, unscaled gradients (the same on every rank)
      if (scaler_) scaler_->unscale(optimizer);
      // The norm is summed over the ranks that hold disjoint pieces: the dp
      // ranks' shards, a pipeline's stages, or under a mesh both (the job).
      dist::ProcessGroup* holders = plan_->sharded() ? (stages_ ? job_group_.get() : group_.get()) : stages_.get();
      // A tied weight's copy is clipped with the rest but counted on its
      // owner's stage only (Note [tied weights across stages]).
      auto counted = plan_->parameters();
      std::vector<torch::Tensor> copies;
      if (tensor_plan_) {
        // Over the tp ranks: each cut parameter's parts counted where they
        // are, a whole one (the same on every tp rank) on the first only.
        holders = tensor_group_.get();
        if (tensor_group_->rank() > 0) {
          for (const auto& p : counted) {
            if (!tensor_plan_->cut(p).cut()) copies.push_back(p);
          }
          counted.erase(std::remove_if(counted.begin(), counted.end(),
                                       [&](const auto& p) { return !tensor_plan_->cut(p).cut(); }),
                        counted.end());
        }
      }
      if (tied_) {
        counted.erase(std::remove_if(counted.begin(), counted.end(), [&](const auto& p) { return tied_->borrows(p); }),
                      counted.end());
        copies = tied_->borrowed();
      }
      optim::clip_grad_norm(counted, options_.clip_grad_norm, holders, copies);
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
  EvalSetup setup;
  setup.dataset = data_.test.get();
  setup.batch_size = options_.batch_size;
  setup.workers = options_.workers;
  setup.group = group_;  // the dp group (null for a pipeline over ranks without a mesh)
  setup.data_ranks = world_;
  return stage_plan_->evaluate(setup, *plan_);
}

StepSettings Trainer::step_settings() const {
  StepSettings step;
  step.task = task_;
  step.amp = amp_;
  step.scaler = scaler_.get();
  step.channels_last = options_.channels_last;
  return step;
}

void Trainer::say(const std::string& line) const {
  if (log_ && options_.progress != "off") std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::warn(const std::string& line) const {
  if (log_) std::fprintf(log_, "tandem: warning: %s\n", printable(line).c_str());
}


}  // namespace tandem::engine
