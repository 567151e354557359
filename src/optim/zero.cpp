#include "tandem/optim/zero.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <numeric>
#include <utility>

#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/util/check.h"

namespace tandem::optim {

std::vector<int64_t> plan_shards(const std::vector<int64_t>& numels, int64_t world,
                                 std::vector<int64_t>* loads) {
  TANDEM_CHECK(world >= 1, "plan_shards: expected a world size of at least 1, got ", world);
  std::vector<int64_t> own_load(static_cast<size_t>(world), 0);
  auto& load = loads ? *loads : own_load;
  TANDEM_CHECK(static_cast<int64_t>(load.size()) == world, "plan_shards: ", load.size(),
               " loads for a world of ", world);
  std::vector<size_t> order(numels.size());
  std::iota(order.begin(), order.end(), size_t{0});
  for (auto n : numels) TANDEM_CHECK(n >= 0, "plan_shards: a parameter of ", n, " elements");
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return numels[a] > numels[b]; });
  std::vector<int64_t> owners(numels.size(), 0);
  for (size_t i : order) {
    auto lightest = std::min_element(load.begin(), load.end()) - load.begin();  // the first of equals
    owners[i] = lightest;
    load[static_cast<size_t>(lightest)] += numels[i];
  }
  return owners;
}

template <class Base>
void ZeroRedundancy<Base>::plan(const std::vector<torch::Tensor>& elsewhere, const std::vector<torch::Tensor>& own) {
  if (group_) {
    rank_ = group_->rank();
    world_ = group_->size();
  }
  std::unordered_map<const c10::TensorImpl*, int64_t> apart;  // not in the shares: kElsewhere or kOwnEverywhere
  for (const auto& p : elsewhere) apart.emplace(p.unsafeGetTensorImpl(), kElsewhere);
  for (const auto& p : own) apart.emplace(p.unsafeGetTensorImpl(), kOwnEverywhere);
  shares_.assign(static_cast<size_t>(world_), {});
  std::vector<int64_t> loads(static_cast<size_t>(world_), 0);
  size_t index = 0;
  for (const auto& g : this->param_groups_) {  // group by group, as PyTorch's
    std::vector<torch::Tensor> here;
    std::vector<int64_t> numels;
    for (const auto& p : g.params()) {
      const auto found = apart.find(p.unsafeGetTensorImpl());
      if (found != apart.end()) {
        bool fresh = owner_.emplace(p.unsafeGetTensorImpl(), found->second).second;
        TANDEM_CHECK(fresh, "optim::ZeroRedundancy: a parameter appears twice among the parameters");
        continue;
      }
      here.push_back(p);
      numels.push_back(p.numel());
    }
    auto owners = plan_shards(numels, world_, &loads);
    for (size_t i = 0; i < numels.size(); ++i, ++index) {
      const auto& p = here[i];
      bool fresh = owner_.emplace(p.unsafeGetTensorImpl(), owners[i]).second;
      TANDEM_CHECK(fresh, "optim::ZeroRedundancy: parameter ", index, " appears twice among the parameters");
      shares_[static_cast<size_t>(owners[i])].push_back(p);
    }
  }
  // Note [sharded optimizer state]: each share's dense parameters as views
  // of one flat buffer per (device, dtype), in the plan's order.
  loose_.assign(static_cast<size_t>(world_), {});
  if (world_ == 1) return;  // nothing is sent; the model stays as it is
  torch::NoGradGuard no_grad;
  for (int64_t r = 0; r < world_; ++r) {
    std::map<std::string, std::vector<torch::Tensor>> kinds;  // by "device/dtype"
    for (const auto& p : shares_[static_cast<size_t>(r)]) {
      if (p.numel() > 0 && p.is_non_overlapping_and_dense()) {
        kinds[p.device().str() + "/" + std::to_string(static_cast<int>(p.scalar_type()))].push_back(p);
      } else {
        loose_[static_cast<size_t>(r)].push_back(p);
      }
    }
    for (auto& [kind, params] : kinds) {
      int64_t total = 0;
      for (const auto& p : params) total += p.numel();
      auto buffer = torch::empty({total}, params.front().options().requires_grad(false));
      int64_t offset = 0;
      for (auto& p : params) {
        // A dense tensor of any strides spans exactly numel elements.
        auto view = buffer.as_strided(p.sizes(), p.strides(), offset);
        view.copy_(p);
        p.set_data(view);
        offset += p.numel();
      }
      flats_.push_back({r, buffer});
    }
  }
}

template <class Base>
std::vector<torch::Tensor> ZeroRedundancy<Base>::flat_buffers() const {
  std::vector<torch::Tensor> buffers;
  for (const auto& f : flats_) buffers.push_back(f.buffer);
  return buffers;
}

template <class Base>
int64_t ZeroRedundancy<Base>::owner(const torch::Tensor& p) const {
  auto found = owner_.find(p.unsafeGetTensorImpl());
  TANDEM_CHECK(found != owner_.end(), "optim::ZeroRedundancy: a parameter of shape ", p.sizes(),
               " is not among those it was constructed with (ownership is planned once, at "
               "construction; a parameter group added later cannot be sharded)");
  return found->second;
}

template <class Base>
std::vector<int64_t> ZeroRedundancy<Base>::shard_numels() const {
  std::vector<int64_t> numels;
  for (const auto& share : shares_) {
    int64_t n = 0;
    for (const auto& p : share) n += p.numel();
    numels.push_back(n);
  }
  return numels;
}

template <class Base>
torch::Tensor ZeroRedundancy<Base>::step(torch::optim::Optimizer::LossClosure closure) {
  // Buffers received by consolidate_state() go stale from this step on.
  if (consolidated_) shard_state();
  auto loss = Base::step(std::move(closure));
  // Note [sharded optimizer state]: each owner's share, from the owner.
  // Every parameter goes, with a gradient or not: the ranks need not agree
  // on which changed, only on the plan.
  if (world_ > 1) {
    // Every buffer in flight before any wait; the parameters are its views.
    std::vector<dist::Work> pending;
    for (auto& f : flats_) pending.push_back(group_->broadcast(f.buffer, f.owner));
    std::vector<dist::CoalescedBroadcast> loose;
    for (int64_t r = 0; r < world_; ++r) {
      if (!loose_[static_cast<size_t>(r)].empty()) loose.emplace_back(loose_[static_cast<size_t>(r)], *group_, r);
    }
    for (auto& work : pending) work.wait();
    for (auto& broadcast : loose) broadcast.wait();
  }
  return loss;
}

template <class Base>
std::vector<torch::Tensor> ZeroRedundancy<Base>::all_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& g : this->param_groups_) {
    for (const auto& p : g.params()) params.push_back(p);
  }
  return params;
}

template <class Base>
void ZeroRedundancy<Base>::consolidate_state() {
  if (world_ == 1) {
    consolidated_ = true;
    return;
  }
  torch::NoGradGuard no_grad;
  const auto params = all_parameters();
  // Which parameters have state: each owner says for its own (one flag per
  // parameter, summed over the ranks). NCCL takes CUDA tensors only.
  auto flag_device = group_->backend() == "nccl" && !params.empty() ? params.front().device() : torch::kCPU;
  auto has = torch::zeros({static_cast<int64_t>(params.size())}, torch::dtype(torch::kInt64));
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner(params[i]) == rank_ && !parameter_state(*this, params[i]).empty()) has[i] = 1;
  }
  has = has.to(flag_device);
  group_->all_reduce(has).wait();
  has = has.cpu();
  // Every slot of every such state (optim/state_tensors.h), from its owner:
  // the owner's tensors, stand-ins elsewhere that become the state after.
  std::vector<std::vector<torch::Tensor>> buffers(static_cast<size_t>(world_));
  std::vector<std::pair<torch::Tensor, std::map<std::string, torch::Tensor>>> received;
  for (size_t i = 0; i < params.size(); ++i) {
    if (has[i].item<int64_t>() == 0) continue;
    const auto& p = params[i];
    int64_t r = owner(p);
    if (r < 0) continue;  // stepped elsewhere, or by each rank its own
    auto& out = buffers[static_cast<size_t>(r)];
    if (r == rank_) {
      for (auto& [name, t] : parameter_state(*this, p)) out.push_back(t.device() == p.device() ? t : t.to(p.device()));
      continue;
    }
    std::map<std::string, torch::Tensor> named;
    for (const auto& slot : state_slots(*this, p)) {
      auto t = torch::zeros(slot.shape, p.options().dtype(slot.dtype));
      named[slot.name] = t;
      out.push_back(t);
    }
    received.emplace_back(p, std::move(named));
  }
  for (int64_t r = 0; r < world_; ++r) dist::broadcast_coalesced(buffers[static_cast<size_t>(r)], *group_, r);
  for (auto& [p, named] : received) set_parameter_state(*this, p, named);
  consolidated_ = true;
}

template <class Base>
void ZeroRedundancy<Base>::shard_state() {
  for (const auto& p : all_parameters()) {
    if (!keeps_state(owner(p))) this->state_.erase(p.unsafeGetTensorImpl());
  }
  consolidated_ = false;
}

template <class Base>
void ZeroRedundancy<Base>::save(torch::serialize::OutputArchive& archive) const {
  TANDEM_CHECK(consolidated_ || world_ == 1, "optim::ZeroRedundancy::save: rank ", rank_, " holds the optimizer "
               "state of its own share of the parameters only; call consolidate_state() on every rank first");
  Base::save(archive);
}

template <class Base>
void ZeroRedundancy<Base>::load(torch::serialize::InputArchive& archive) {
  Base::load(archive);
  shard_state();
}

template class ZeroRedundancy<Sgd>;
template class ZeroRedundancy<AdamW>;

}  // namespace tandem::optim
