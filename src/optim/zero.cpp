#include "tandem/optim/zero.h"

#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>
#include <numeric>
#include <utility>

#include <torch/torch.h>

#include "tandem/dist/collectives.h"
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

ZeroSgd::ZeroSgd(std::vector<torch::Tensor> params, torch::optim::SGDOptions options,
                 std::shared_ptr<dist::ProcessGroup> group, const std::vector<torch::Tensor>& elsewhere)
    : Sgd(std::move(params), options), group_(std::move(group)) {
  plan(elsewhere);
}

ZeroSgd::ZeroSgd(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::SGDOptions options,
                 std::shared_ptr<dist::ProcessGroup> group)
    : Sgd(std::move(groups), options), group_(std::move(group)) {
  plan();
}

void ZeroSgd::plan(const std::vector<torch::Tensor>& elsewhere) {
  if (group_) {
    rank_ = group_->rank();
    world_ = group_->size();
  }
  std::unordered_set<const c10::TensorImpl*> away;
  for (const auto& p : elsewhere) away.insert(p.unsafeGetTensorImpl());
  shares_.assign(static_cast<size_t>(world_), {});
  std::vector<int64_t> loads(static_cast<size_t>(world_), 0);
  size_t index = 0;
  for (const auto& g : param_groups_) {  // group by group, as PyTorch's
    std::vector<torch::Tensor> here;
    std::vector<int64_t> numels;
    for (const auto& p : g.params()) {
      if (away.count(p.unsafeGetTensorImpl()) != 0) {
        bool fresh = owner_.emplace(p.unsafeGetTensorImpl(), -1).second;
        TANDEM_CHECK(fresh, "optim::ZeroSgd: a parameter appears twice among the parameters");
        continue;
      }
      here.push_back(p);
      numels.push_back(p.numel());
    }
    auto owners = plan_shards(numels, world_, &loads);
    for (size_t i = 0; i < numels.size(); ++i, ++index) {
      const auto& p = here[i];
      bool fresh = owner_.emplace(p.unsafeGetTensorImpl(), owners[i]).second;
      TANDEM_CHECK(fresh, "optim::ZeroSgd: parameter ", index, " appears twice among the parameters");
      shares_[static_cast<size_t>(owners[i])].push_back(p);
    }
  }
  // Note [sharded optimizer state]: each share's dense parameters as views
  // of one flat buffer per (device, dtype), in the plan's order.
  loose_.assign(static_cast<size_t>(world_), {});
  if (world_ == 1) return;  // nothing is sent; the model stays as it is
  torch::NoGradGuard no_grad;
  for (int64_t r = 0; r < world_; ++r) {
    std::map<std::pair<std::string, int>, std::vector<torch::Tensor>> kinds;
    for (const auto& p : shares_[static_cast<size_t>(r)]) {
      if (p.numel() > 0 && p.is_non_overlapping_and_dense()) {
        kinds[{p.device().str(), static_cast<int>(p.scalar_type())}].push_back(p);
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

std::vector<torch::Tensor> ZeroSgd::flat_buffers() const {
  std::vector<torch::Tensor> buffers;
  for (const auto& f : flats_) buffers.push_back(f.buffer);
  return buffers;
}

int64_t ZeroSgd::owner(const torch::Tensor& p) const {
  auto found = owner_.find(p.unsafeGetTensorImpl());
  TANDEM_CHECK(found != owner_.end(), "optim::ZeroSgd: a parameter of shape ", p.sizes(),
               " is not among those it was constructed with (ownership is planned once, at "
               "construction; a parameter group added later cannot be sharded)");
  return found->second;
}

std::vector<int64_t> ZeroSgd::shard_numels() const {
  std::vector<int64_t> numels;
  for (const auto& share : shares_) {
    int64_t n = 0;
    for (const auto& p : share) n += p.numel();
    numels.push_back(n);
  }
  return numels;
}

torch::Tensor ZeroSgd::step(LossClosure closure) {
  // Buffers received by consolidate_state() go stale from this step on.
  if (consolidated_) shard_state();
  auto loss = Sgd::step(std::move(closure));
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

std::vector<torch::Tensor> ZeroSgd::all_parameters() const {
  std::vector<torch::Tensor> params;
  for (const auto& g : param_groups_) {
    for (const auto& p : g.params()) params.push_back(p);
  }
  return params;
}

void ZeroSgd::consolidate_state() {
  if (world_ == 1) {
    consolidated_ = true;
    return;
  }
  torch::NoGradGuard no_grad;
  const auto params = all_parameters();
  // Which parameters have a momentum buffer: each owner says for its own
  // (one flag per parameter, summed over the ranks). NCCL takes CUDA tensors only.
  auto flag_device = group_->backend() == "nccl" && !params.empty() ? params.front().device() : torch::kCPU;
  auto has = torch::zeros({static_cast<int64_t>(params.size())}, torch::dtype(torch::kInt64));
  for (size_t i = 0; i < params.size(); ++i) {
    if (owner(params[i]) == rank_ && state_.count(params[i].unsafeGetTensorImpl())) has[i] = 1;
  }
  has = has.to(flag_device);
  group_->all_reduce(has).wait();
  has = has.cpu();
  std::vector<std::vector<torch::Tensor>> buffers(static_cast<size_t>(world_));
  for (size_t i = 0; i < params.size(); ++i) {
    if (has[i].item<int64_t>() == 0) continue;
    const auto& p = params[i];
    int64_t r = owner(p);
    if (r < 0) continue;  // stepped elsewhere
    auto* key = p.unsafeGetTensorImpl();
    if (r != rank_ && !state_.count(key)) {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      state->momentum_buffer(torch::empty_like(p, torch::MemoryFormat::Preserve));
      state_[key] = std::move(state);
    }
    buffers[static_cast<size_t>(r)].push_back(
        static_cast<torch::optim::SGDParamState&>(*state_.at(key)).momentum_buffer());
  }
  for (int64_t r = 0; r < world_; ++r) dist::broadcast_coalesced(buffers[static_cast<size_t>(r)], *group_, r);
  consolidated_ = true;
}

void ZeroSgd::shard_state() {
  for (const auto& p : all_parameters()) {
    if (owner(p) != rank_) state_.erase(p.unsafeGetTensorImpl());
  }
  consolidated_ = false;
}

void ZeroSgd::save(torch::serialize::OutputArchive& archive) const {
  TANDEM_CHECK(consolidated_ || world_ == 1, "optim::ZeroSgd::save: rank ", rank_, " holds the momentum "
               "of its own share of the parameters only; call consolidate_state() on every rank first");
  Sgd::save(archive);
}

void ZeroSgd::load(torch::serialize::InputArchive& archive) {
  Sgd::load(archive);
  shard_state();
}

}  // namespace tandem::optim
