#include "tandem/parallel/fsdp_optimizer.h"

#include <map>
#include <memory>

#include <torch/torch.h>

#include "tandem/optim/state_tensors.h"
#include "tandem/util/check.h"

namespace tandem::parallel {

template <class Base>
torch::Tensor FullyShardedOptimizer<Base>::step(torch::optim::Optimizer::LossClosure closure) {
  full_state_.clear();  // stale from this step on
  consolidated_ = false;
  return Base::step(std::move(closure));
}

template <class Base>
void FullyShardedOptimizer<Base>::consolidate_state() {
  // Every shard has its state, or none has (they step together).
  const auto& shards = fsdp_.parameters();
  std::vector<NamedState> parts;
  for (const auto& shard : shards) {
    auto state = optim::parameter_state(*this, shard);
    if (!state.empty()) parts.push_back(std::move(state));
  }
  TANDEM_CHECK(parts.empty() || parts.size() == shards.size(), "FullyShardedOptimizer: ", parts.size(), " of ",
               shards.size(), " shards have optimizer state; expected all or none");
  full_state_.assign(fsdp_.model_parameters().size(), {});
  if (!parts.empty()) {
    // Slot by slot: a tensor shaped like the shard is gathered (a
    // collective); a 0-dim one (AdamW's step) is every shard's alike.
    for (size_t slot = 0; slot < parts[0].size(); ++slot) {
      const auto& name = parts[0][slot].first;
      if (parts[0][slot].second.dim() == 0) {
        for (auto& state : full_state_) state.emplace_back(name, parts[0][slot].second.clone());
        continue;
      }
      std::vector<torch::Tensor> slices;
      for (const auto& part : parts) slices.push_back(part[slot].second);
      auto full = fsdp_.gather_like_parameters(slices);
      for (size_t i = 0; i < full.size(); ++i) full_state_[i].emplace_back(name, std::move(full[i]));
    }
  }
  consolidated_ = true;
}

template <class Base>
std::unique_ptr<Base> FullyShardedOptimizer<Base>::whole() const {
  std::unique_ptr<Base> plain;
  if constexpr (std::is_same_v<Base, optim::AdamW>) {
    const auto& defaults = static_cast<const torch::optim::AdamWOptions&>(this->defaults());
    plain = std::make_unique<Base>(optim::decay_groups(fsdp_.model_parameters(), fsdp_.parameter_shapes(), defaults),
                                   defaults);
  } else {
    plain = std::make_unique<Base>(fsdp_.model_parameters(),
                                   static_cast<const torch::optim::SGDOptions&>(this->defaults()));
  }
  // Its groups are these, group for group (Note [fsdp weight decay]).
  TANDEM_CHECK(plain->param_groups().size() == this->param_groups_.size(), "FullyShardedOptimizer: ",
               plain->param_groups().size(), " parameter groups for ", this->param_groups_.size());
  for (size_t g = 0; g < this->param_groups_.size(); ++g) {
    plain->param_groups()[g].set_options(this->param_groups_[g].options().clone());
  }
  return plain;
}

template <class Base>
void FullyShardedOptimizer<Base>::save(torch::serialize::OutputArchive& archive) const {
  TANDEM_CHECK(consolidated_ || fsdp_.world_size() == 1, "FullyShardedOptimizer::save: rank ", fsdp_.rank(),
               " holds its shards' state only; call consolidate_state() on every rank first");
  auto& self = const_cast<FullyShardedOptimizer&>(*this);
  if (!consolidated_) self.consolidate_state();  // one rank: no collective
  // Note [fsdp optimizer state]: what the plain optimizer over the model would hold.
  auto plain = whole();
  const auto& params = fsdp_.model_parameters();
  const auto shapes = fsdp_.parameter_shapes();
  for (size_t i = 0; i < full_state_.size(); ++i) {
    if (full_state_[i].empty()) continue;
    std::map<std::string, torch::Tensor> named(full_state_[i].begin(), full_state_[i].end());
    optim::set_parameter_state(*plain, params[i], named, shapes[i]);
  }
  plain->save(archive);
}

template <class Base>
void FullyShardedOptimizer<Base>::load(torch::serialize::InputArchive& archive) {
  auto plain = whole();
  plain->load(archive);
  // The options (the learning rate of the step it was written at, for one)
  // of each group: the plain optimizer's groups are these, group for group
  // (Note [fsdp weight decay]).
  TANDEM_CHECK(plain->param_groups().size() == this->param_groups_.size(), "FullyShardedOptimizer::load: ",
               plain->param_groups().size(), " parameter groups for ", this->param_groups_.size());
  for (size_t g = 0; g < this->param_groups_.size(); ++g) {
    this->param_groups_[g].set_options(plain->param_groups()[g].options().clone());
  }
  std::vector<NamedState> state;
  for (const auto& p : fsdp_.model_parameters()) state.push_back(optim::parameter_state(*plain, p));
  load_full_state(state);
}

template <class Base>
void FullyShardedOptimizer<Base>::load_full_state(const std::vector<NamedState>& state) {
  this->state_.clear();
  full_state_.clear();
  consolidated_ = false;
  const auto& params = fsdp_.model_parameters();
  TANDEM_CHECK(state.size() == params.size(), "FullyShardedOptimizer::load: state for ", state.size(),
               " parameters, the model has ", params.size());
  size_t with = 0;
  for (const auto& s : state) with += s.empty() ? 0 : 1;
  if (with == 0) return;
  TANDEM_CHECK(with == params.size(), "FullyShardedOptimizer::load: ", with, " of ", params.size(),
               " parameters have optimizer state; expected all or none");
  const auto& shards = fsdp_.parameters();
  std::vector<std::map<std::string, torch::Tensor>> per_shard(shards.size());
  for (size_t slot = 0; slot < state[0].size(); ++slot) {
    const auto& name = state[0][slot].first;
    if (state[0][slot].second.dim() == 0) {
      for (auto& named : per_shard) named[name] = state[0][slot].second;
      continue;
    }
    std::vector<torch::Tensor> full;
    for (const auto& s : state) {
      TANDEM_CHECK(slot < s.size() && s[slot].first == name, "FullyShardedOptimizer::load: a parameter's state "
                   "lacks ", name);
      full.push_back(s[slot].second);
    }
    auto sliced = fsdp_.shard_like_parameters(full);
    for (size_t i = 0; i < shards.size(); ++i) per_shard[i][name] = std::move(sliced[i]);
  }
  for (size_t i = 0; i < shards.size(); ++i) optim::set_parameter_state(*this, shards[i], per_shard[i]);
}

template class FullyShardedOptimizer<optim::Sgd>;
template class FullyShardedOptimizer<optim::AdamW>;

}  // namespace tandem::parallel
