#include "tandem/parallel/fsdp_sgd.h"

#include <memory>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

torch::optim::SGDParamState* momentum_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  auto& state = optimizer.state();
  auto found = state.find(p.unsafeGetTensorImpl());
  return found == state.end() ? nullptr : static_cast<torch::optim::SGDParamState*>(found->second.get());
}

}  // namespace

FsdpSgd::FsdpSgd(FullyShardedDataParallel& fsdp, torch::optim::SGDOptions options)
    : Sgd(fsdp.parameters(), options), fsdp_(fsdp) {}

torch::Tensor FsdpSgd::step(LossClosure closure) {
  full_momentum_.clear();  // stale from this step on
  consolidated_ = false;
  return Sgd::step(std::move(closure));
}

void FsdpSgd::consolidate_state() {
  // Every shard has a momentum buffer, or none has (they step together).
  const auto& shards = fsdp_.parameters();
  std::vector<torch::Tensor> parts;
  for (const auto& shard : shards) {
    if (auto* state = momentum_state(*this, shard)) parts.push_back(state->momentum_buffer());
  }
  TANDEM_CHECK(parts.empty() || parts.size() == shards.size(), "FsdpSgd: ", parts.size(), " of ",
               shards.size(), " shards have a momentum buffer; expected all or none");
  full_momentum_.clear();
  if (!parts.empty()) full_momentum_ = fsdp_.gather_like_parameters(parts);
  consolidated_ = true;
}

void FsdpSgd::save(torch::serialize::OutputArchive& archive) const {
  TANDEM_CHECK(consolidated_ || fsdp_.world_size() == 1, "FsdpSgd::save: rank ", fsdp_.rank(),
               " holds its shards' momentum only; call consolidate_state() on every rank first");
  auto& self = const_cast<FsdpSgd&>(*this);
  if (!consolidated_) self.consolidate_state();  // one rank: no collective
  // Note [fsdp optimizer state]: what optim::Sgd over the model would hold.
  optim::Sgd whole(fsdp_.model_parameters(), static_cast<const torch::optim::SGDOptions&>(defaults()));
  whole.param_groups()[0].set_options(param_groups_[0].options().clone());
  for (size_t i = 0; i < full_momentum_.size(); ++i) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(full_momentum_[i]);
    whole.state()[fsdp_.model_parameters()[i].unsafeGetTensorImpl()] = std::move(state);
  }
  whole.save(archive);
}

void FsdpSgd::load(torch::serialize::InputArchive& archive) {
  optim::Sgd whole(fsdp_.model_parameters(), static_cast<const torch::optim::SGDOptions&>(defaults()));
  whole.load(archive);
  param_groups_[0].set_options(whole.param_groups()[0].options().clone());
  std::vector<torch::Tensor> momentum;
  for (const auto& p : fsdp_.model_parameters()) {
    if (auto* state = momentum_state(whole, p)) momentum.push_back(state->momentum_buffer());
  }
  load_full_momentum(momentum);
}

void FsdpSgd::load_full_momentum(const std::vector<torch::Tensor>& momentum) {
  state_.clear();
  full_momentum_.clear();
  consolidated_ = false;
  if (momentum.empty()) return;
  TANDEM_CHECK(momentum.size() == fsdp_.model_parameters().size(), "FsdpSgd::load: ", momentum.size(),
               " of ", fsdp_.model_parameters().size(), " parameters have a momentum buffer; expected "
               "all or none");
  auto shards = fsdp_.shard_like_parameters(momentum);
  for (size_t i = 0; i < shards.size(); ++i) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(shards[i]);
    state_[fsdp_.parameters()[i].unsafeGetTensorImpl()] = std::move(state);
  }
}

}  // namespace tandem::parallel
