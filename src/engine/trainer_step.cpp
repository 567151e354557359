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
  RECORD_USER_SCOPE("tandem::step");  // the phases, for --profile-out (observe/profile.h)
  // Note [stage plans]: the data plan begins and reduces, the stage plan
  // runs forward and backward between.
  plan_->begin_step(optimizer);  // gradients cleared, BatchNorm statistics from dp rank 0
  StepOutputs out = stage_plan_->forward_backward(inputs, targets, *plan_, counters.stage_idle);
  if (stage_plan_->stages() > 0) ++counters.pipeline_steps;
  {
    RECORD_USER_SCOPE("tandem::reduce");
    plan_->after_backward();  // the gradients averaged over the dp ranks
    mesh_.reduce_gradients(*plan_, [this] { return placed_parameters(/*gradients=*/true); });  // Note [mesh plan]
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
    mesh_.refresh_copies(*plan_);  // Note [tied weights under fsdp]
  }
  return out;
}

// What this rank holds, placed on the mesh (Note [placements]): the dp
// plan's pieces, each given its placement over tp by the tensor-parallel
// plan, and a tied weight's copy marked as another stage's. `gradients`:
// the placements of their gradients after backward, before the tp sum.
std::vector<dist::PlacedTensor> Trainer::placed_parameters(bool gradients) const {
  auto placed = plan_->placed_parameters();
  mesh_.place(placed, gradients);
  return placed;
}

// --clip-grad-norm: the global norm of the whole model's gradient, summed
// over the ranks that hold disjoint pieces (a pipeline's stages, tp's
// parts, FSDP's shards) with each piece counted once (a replicated one on
// its first rank there, a tied copy on its owner's stage), and every piece
// clipped.
// Under ep the experts' pieces differ over the ep group and repeat over
// the ranks holding the same experts: their squares are summed over ep
// first, and join the norm as one number (Note [expert gradients]).
void Trainer::clip_gradients() {
  const auto mesh = mesh_.placement_mesh(plan_->sharded());
  auto placed = placed_parameters();
  const bool experts = !mesh_.expert_weights().empty();
  std::vector<torch::Tensor> expert_grads;
  if (experts) {
    std::vector<dist::PlacedTensor> dense;
    for (auto& t : placed) {
      if (!mesh_.spreads(t.model_parameter)) {
        dense.push_back(std::move(t));
      } else if (t.grad().defined()) {
        expert_grads.push_back(t.grad());
      }
    }
    placed = std::move(dense);
  }
  auto grads = dist::counted_gradients(placed, mesh);
  if (experts) {
    auto squares = torch::zeros({}, torch::kFloat64);
    for (const auto& g : expert_grads) squares += g.detach().to(torch::kFloat64).pow(2).sum().cpu();
    auto wire = squares.reshape({1}).to(mesh_.groups.expert->wire_device());
    mesh_.groups.expert->all_reduce(wire).wait();
    // One number whose square is the ep group's: counted with the rest (and
    // scaled too, harmlessly); the experts' own gradients scaled only.
    const auto& like = expert_grads.empty() ? wire : expert_grads.front();
    grads.counted.push_back(wire.sqrt().to(like.device(), like.scalar_type()));
    grads.others.insert(grads.others.end(), expert_grads.begin(), expert_grads.end());
  }
  optim::clip_gradients(grads.counted, options_.clip_grad_norm, mesh.sum_group(), grads.others);
}

EvalResult Trainer::evaluate() {
  TANDEM_CHECK(data_.test, "no evaluation data for ", options_.data, " (give --val-data)");
  EvalSetup setup;
  setup.dataset = data_.test.get();
  setup.batch_size = options_.batch_size;
  setup.workers = options_.workers;
  setup.group = mesh_.groups.data;  // the dp group (null for a pipeline over ranks without a mesh)
  setup.data_ranks = world_;
  setup.cut = mesh_.sequence_cut();  // context parallelism: each rank its part of the sequences
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
  if (log_ && options_.progress != ProgressMode::kOff) std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::notice(const std::string& line) const {
  if (log_) std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::warn(const std::string& line) const {
  if (log_) std::fprintf(log_, "tandem: warning: %s\n", printable(line).c_str());
}


}  // namespace tandem::engine
