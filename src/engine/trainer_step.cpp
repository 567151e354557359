// One training step as the layout says, and evaluation (trainer.h).
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <iterator>
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
    if (tensor_plan_) tensor_plan_->reduce_gradients();  // Note [sequence-parallel plans]
  }
  {
    RECORD_USER_SCOPE("tandem::optimizer");
    if (options_.clip_grad_norm > 0) {  // on the averaged, unscaled gradients (the same on every rank)
      if (scaler_) scaler_->unscale(optimizer);
      clip_gradients();
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

// --clip-grad-norm: the norm of the whole model's gradient, each piece
// counted once. It is summed over the ranks that hold disjoint pieces: the
// dp ranks' shards, a pipeline's stages, or under a mesh all of them (the
// job); with tensor parallelism the ranks of one copy of the model
// (model_group_), a whole parameter (the same on every tp rank) counted on
// the first tp rank only (under FSDP, the runs of the shards that hold
// whole parameters). A tied weight's copy is clipped with the rest but
// counted on its owner's stage only (Note [tied weights across stages]).
void Trainer::clip_gradients() {
  dist::ProcessGroup* holders = plan_->sharded() ? (stages_ ? job_group_.get() : group_.get()) : stages_.get();
  auto counted = plan_->parameters();
  std::vector<torch::Tensor> copies;
  if (tensor_plan_ && plan_->fully_sharded() && tensor_group_->rank() > 0) {
    // FSDP's flat shards mix cut and whole parameters: their runs, by the
    // shards' spans (the padding is zeros, in neither).
    auto* fsdp = plan_->fully_sharded();
    std::vector<torch::Tensor> cut_runs, whole_runs;
    const auto spans = fsdp->shard_spans();
    for (size_t i = 0; i < spans.size(); ++i) {
      const auto& grad = fsdp->parameters()[i].grad();
      if (!grad.defined()) continue;
      for (const auto& span : spans[i]) {
        const bool cut = tensor_plan_->cut(fsdp->model_parameters()[span.parameter]).cut();
        (cut ? cut_runs : whole_runs).push_back(grad.narrow(0, span.shard_offset, span.numel));
      }
    }
    optim::clip_gradients(cut_runs, options_.clip_grad_norm, job_group_.get(), whole_runs);
    return;
  }
  if (tensor_plan_) {
    holders = plan_->sharded() ? job_group_.get() : model_group_.get();
    auto whole = [&](const torch::Tensor& p) { return !tensor_plan_->cut(p).cut(); };
    if (tensor_group_->rank() > 0) {
      std::copy_if(counted.begin(), counted.end(), std::back_inserter(copies), whole);
      counted.erase(std::remove_if(counted.begin(), counted.end(), whole), counted.end());
    }
  }
  if (tied_) {
    counted.erase(std::remove_if(counted.begin(), counted.end(), [&](const auto& p) { return tied_->borrows(p); }),
                  counted.end());
    for (const auto& p : tied_->borrowed()) copies.push_back(p);
  }
  optim::clip_grad_norm(counted, options_.clip_grad_norm, holders, copies);
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

void Trainer::notice(const std::string& line) const {
  if (log_) std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::warn(const std::string& line) const {
  if (log_) std::fprintf(log_, "tandem: warning: %s\n", printable(line).c_str());
}


}  // namespace tandem::engine
