// Under FSDP x pipeline (or tp), the whole model's optimizer state that
// its checkpoints hold (Trainer::whole_model_optimizer), and the way back.
#include "tandem/engine/trainer.h"

#include <functional>
#include <map>
#include <unordered_set>

#include "tandem/optim/state_tensors.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/check.h"

namespace tandem::engine {

// Note [fsdp x pipeline checkpoints]: a checkpoint holds the plain
// optimizer's state over the whole model, whatever the layout, so that any
// other layout resumes it. Under FSDP x pipeline no rank's optimizer is
// that: FsdpSgd or FsdpAdamW steps this rank's shards of its own stage. So
// the state goes through the plain optimizer over model_->parameters(): on
// save, this stage's state gathered over its dp ranks (consolidate_state)
// is put in it, then the other stages' arrive with gather_stages; on
// resume, the checkpoint loads into it and this rank keeps its shards'
// slices (load_full_state). Collectives: every rank calls both.
std::unique_ptr<torch::optim::Optimizer> Trainer::whole_model_optimizer(torch::optim::Optimizer& sharded,
                                                                        bool with_state) {
  std::unique_ptr<torch::optim::Optimizer> whole;
  const auto& options = sharded.param_groups()[0].options();
  if (const auto* group = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    // The step's options (its learning rate), with the run's weight decay
    // (this stage's first group may be the undecayed one).
    torch::optim::AdamWOptions adamw = *group;
    adamw.weight_decay(static_cast<const torch::optim::AdamWOptions&>(sharded.defaults()).weight_decay());
    whole = std::make_unique<optim::AdamW>(optim::decay_groups(model_->named_parameters(), adamw), adamw);
  } else {
    whole = std::make_unique<optim::Sgd>(model_->parameters(),
                                         static_cast<const torch::optim::SGDOptions&>(sharded.defaults()));
    whole->param_groups()[0].set_options(options.clone());
  }
  if (!with_state) return whole;
  auto& state = dynamic_cast<parallel::FsdpState&>(sharded);
  state.consolidate_state();  // over the dp ranks
  const auto& params = plan_->fully_sharded()->model_parameters();
  const auto& full = state.full_state();
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i].empty()) continue;
    optim::set_parameter_state(*whole, params[i], std::map<std::string, torch::Tensor>(full[i].begin(), full[i].end()));
  }
  return whole;
}

void Trainer::keep_shards_of(const torch::optim::Optimizer& whole, torch::optim::Optimizer& sharded) {
  // The options of the step it was written at, in each group; the weight
  // decay stays the group's own (Note [fsdp weight decay]: decayed or not).
  for (auto& group : sharded.param_groups()) {
    auto options = whole.param_groups()[0].options().clone();
    if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) {
      adamw->weight_decay(static_cast<const torch::optim::AdamWOptions&>(group.options()).weight_decay());
    }
    group.set_options(std::move(options));
  }
  std::vector<parallel::NamedState> state;
  for (const auto& p : plan_->fully_sharded()->model_parameters()) state.push_back(optim::parameter_state(whole, p));
  dynamic_cast<parallel::FsdpState&>(sharded).load_full_state(state);
}

}  // namespace tandem::engine
