// Note [tied weights across stages] (tied_stages.h).
#include "tandem/engine/tied_stages.h"

#include <algorithm>

#include <torch/torch.h>

#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::engine {

std::unique_ptr<TiedStages> TiedStages::make(const std::vector<models::Sequence>& pieces,
                                             const std::shared_ptr<dist::ProcessGroup>& stages,
                                             std::shared_ptr<dist::ProcessGroup> data, const torch::Device& device) {
  const auto count = static_cast<int64_t>(stages->size()), rank = stages->rank();
  auto owner_of = [&](const torch::Tensor& t) -> int64_t {
    for (size_t k = 0; k < pieces.size(); ++k) {
      for (const auto& p : pieces[k]->parameters()) {
        if (p.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return static_cast<int64_t>(k);
      }
    }
    return -1;
  };
  auto result = std::make_unique<TiedStages>();
  result->data_ = std::move(data);
  result->options_ = torch::TensorOptions().device(device);
  // Every rank finds the same ties in the same order (the same pieces), so
  // the splits below agree.
  for (size_t k = 0; k < pieces.size(); ++k) {
    for (const auto& module : pieces[k]->modules(/*include_self=*/true)) {
      const auto* user = dynamic_cast<const models::TiedWeightUser*>(module.get());
      if (user == nullptr || !user->tied().defined()) continue;
      const int64_t owner = owner_of(user->tied());
      TANDEM_CHECK(owner >= 0, "pipeline: a layer of piece ", k, " reads a tied weight that no piece of the model holds");
      const int64_t owner_rank = owner % count, user_rank = static_cast<int64_t>(k) % count;
      if (owner_rank == user_rank) continue;  // one rank holds both uses: autograd sums them
      const std::vector<int64_t> pair{std::min(owner_rank, user_rank), std::max(owner_rank, user_rank)};
      const bool mine = rank == owner_rank || rank == user_rank;
      auto group = stages->split("tied-weight", mine ? pair : std::vector<int64_t>{rank});
      if (result->description_.empty()) {
        result->description_ = format("the weight piece %lld's layer reads is piece %lld's (stages %lld and %lld keep "
                                      "their copies equal: their gradients summed each step)",
                                      static_cast<long long>(k), static_cast<long long>(owner),
                                      static_cast<long long>(owner_rank), static_cast<long long>(user_rank));
      }
      if (!mine) continue;
      Tie tie{user->tied(), rank == user_rank, std::move(group), user_rank > owner_rank ? 1 : 0,
              user->tied().sizes().vec()};
      result->options_ = result->options_.dtype(user->tied().dtype());
      if (tie.copy) {
        // Another rank's piece may have been left on the CPU: the copy is
        // used here, so it lives on this rank's device.
        torch::NoGradGuard no_grad;
        if (tie.weight.device() != device) tie.weight.set_data(tie.weight.to(device));
        result->borrowed_.push_back(tie.weight);
      }
      result->ties_.push_back(std::move(tie));
    }
  }
  if (result->description_.empty()) return nullptr;
  return result;
}

bool TiedStages::borrows(const torch::Tensor& p) const {
  return std::any_of(borrowed_.begin(), borrowed_.end(),
                     [&](const torch::Tensor& b) { return b.unsafeGetTensorImpl() == p.unsafeGetTensorImpl(); });
}

void TiedStages::share_owner_shards(std::shared_ptr<dist::ProcessGroup> shard_group) {
  shard_group_ = std::move(shard_group);
}

torch::Tensor TiedStages::flat_of(const Tie& tie, const std::vector<dist::PlacedTensor>* runs) const {
  int64_t numel = 1;
  for (auto size : tie.shape) numel *= size;
  auto flat = torch::zeros({numel}, options_);
  if (runs == nullptr) return flat;
  for (const auto& run : *runs) {
    if (run.model_parameter.unsafeGetTensorImpl() != tie.weight.unsafeGetTensorImpl()) continue;
    flat.narrow(0, run.parameter_offset, run.flat_numel)
        .copy_(run.value().detach());
  }
  return flat;
}

void TiedStages::refresh_copies(const DataPlan& plan) {
  if (!shard_group_) return;  // both uses step their own, equal weights
  torch::NoGradGuard no_grad;
  const auto placed = plan.placed_parameters();
  for (auto& tie : ties_) {
    auto flat = flat_of(tie, tie.copy ? nullptr : &placed);
    if (!tie.copy && shard_group_->size() > 1) shard_group_->all_reduce(flat).wait();  // the runs made whole
    tie.pair->broadcast(flat, 1 - tie.copy_root).wait();
    if (tie.copy) tie.weight.detach().copy_(flat.view(tie.shape));
  }
}

void TiedStages::reduce_gradients(const DataPlan& plan) {
  torch::NoGradGuard no_grad;
  if (shard_group_) {  // Note [tied weights under fsdp]
    const auto placed = plan.placed_parameters();
    for (auto& tie : ties_) {
      auto flat = flat_of(tie, nullptr);
      if (tie.copy) {
        auto& grad = tie.weight.mutable_grad();
        if (grad.defined()) {
          if (data_ && data_->size() > 1) data_->all_reduce(grad, dist::ReduceOp::kAvg).wait();
          flat.copy_(grad.reshape({-1}));
          grad.zero_();  // the copy does not step: refresh_copies gives it the owner's weight
        }
      }
      tie.pair->broadcast(flat, tie.copy_root).wait();
      if (tie.copy) continue;
      for (const auto& run : placed) {
        if (run.model_parameter.unsafeGetTensorImpl() != tie.weight.unsafeGetTensorImpl()) continue;
        auto& grad = run.tensor.mutable_grad();
        if (!grad.defined()) grad = torch::zeros_like(run.tensor);
        dist::in_memory_order(grad).narrow(0, run.flat_offset, run.flat_numel)
            .add_(flat.narrow(0, run.parameter_offset, run.flat_numel));
      }
    }
    return;
  }
  for (auto& tie : ties_) {
    auto& grad = tie.weight.mutable_grad();
    if (!grad.defined()) grad = torch::zeros_like(tie.weight);
    // The copy's gradient is this rank's alone so far: averaged over the
    // dp ranks as the data plan averaged the owner's.
    if (tie.copy && data_ && data_->size() > 1) data_->all_reduce(grad, dist::ReduceOp::kAvg).wait();
    tie.pair->all_reduce(grad).wait();
  }
}

}  // namespace tandem::engine
