// Expert parallelism on the mesh (mesh_plan.h; Note [expert dispatch] in
// parallel/expert_parallel.h).
//
// Note [expert gradients]: the loss of each data rank is the mean over its
// tokens, and one process's gradient is the mean of the D data ranks'.
// An expert's gradient on the rank holding it already sums what every
// rank of its ep group sent it, so summed over the ranks holding the same
// experts (D / ep of them) it sums all D ranks' contributions: divided by
// D, it is one process's. The experts' weights are kept out of the dp
// plan, whose average over all D ranks would mix different experts.
#include <torch/torch.h>

#include "tandem/dist/placement.h"
#include "tandem/engine/mesh_plan.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/parallel/expert_parallel.h"
#include "tandem/util/check.h"

namespace tandem::engine {

void MeshPlan::cut_over_expert_ranks(models::Sequence& model, const TrainOptions& o) {
  if (!groups.expert) return;
  try {
    for (const auto& m : model->modules(/*include_self=*/false)) {
      auto* moe = dynamic_cast<models::SparseMoeImpl*>(m.get());
      if (moe == nullptr) continue;
      parallel::spread_experts(*moe, groups.expert);
      spread_layers_.push_back(moe);
      for (auto* w : {&moe->experts->gate_proj, &moe->experts->up_proj, &moe->experts->down_proj}) {
        expert_weights_.push_back(*w);
      }
    }
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError("--mesh " + o.mesh.text() + ": " + e.what());
  }
  TANDEM_CHECK_USAGE(!spread_layers_.empty(), "--mesh ", o.mesh.text(), ": ", o.model,
                     " has no mixture-of-experts layer to spread over ep");
  experts_spread_ = true;
}

void MeshPlan::reduce_expert_gradients() {
  if (expert_weights_.empty()) return;
  std::vector<torch::Tensor> grads;
  for (const auto& w : expert_weights_) {
    if (w.grad().defined()) grads.push_back(w.grad());
  }
  if (grads.empty()) return;
  if (groups.expert_replicate && groups.expert_replicate->size() > 1) {
    groups.expert_replicate->all_reduce(grads, dist::ReduceOp::kSum).wait();
  }
  const double data_ranks = static_cast<double>(groups.data ? groups.data->size() : 1);
  for (auto& g : grads) g.div_(data_ranks);
}

namespace {

// The experts' cut over ep: Shard(0) of the whole's experts in equal runs,
// rank r's from r E/ep on, as spread_experts keeps them.
dist::Placement experts_cut(int64_t whole_experts) { return dist::Placement::shard(0, whole_experts); }

}  // namespace

// Note [expert checkpoints in one file]: a checkpoint file holds every
// expert whole, as one process's, so that any layout resumes from it.
// Before it is written or read, each rank's experts (after tp made its
// parts whole) are gathered over ep along the experts' dim, with their
// optimizer state; after, each rank keeps its rows of the whole again,
// the ones spread_experts gave it (rank r of ep: experts r E/ep onwards).
void MeshPlan::make_experts_whole(torch::optim::Optimizer* optimizer) {
  if (expert_weights_.empty()) return;
  TANDEM_CHECK(held_experts_.empty(), "MeshPlan: make_whole() twice");
  torch::NoGradGuard no_grad;
  auto& group = *groups.expert;
  for (auto& w : expert_weights_) {  // every rank of the group, in the same order
    const auto held_shape = w.sizes().vec();
    const auto cut = experts_cut(w.size(0) * group.size());
    held_experts_.push_back(w.detach());
    w.set_data(dist::whole_of_part(w.detach(), cut, group));
    if (optimizer) {
      optim::map_parameter_state(*optimizer, w, held_shape,
                                 [&](const torch::Tensor& t) { return dist::whole_of_part(t, cut, group); });
    }
  }
}

void MeshPlan::cut_experts_again(torch::optim::Optimizer* optimizer) {
  if (held_experts_.empty()) return;
  torch::NoGradGuard no_grad;
  const auto& group = *groups.expert;
  for (size_t i = 0; i < expert_weights_.size(); ++i) {
    auto& w = expert_weights_[i];
    auto held = held_experts_[i];
    const auto whole_shape = w.sizes().vec();
    const auto cut = experts_cut(w.size(0));
    held.copy_(dist::part_of_whole(w.detach(), cut, group));
    w.set_data(held);
    if (optimizer) {
      optim::map_parameter_state(*optimizer, w, whole_shape,
                                 [&](const torch::Tensor& t) { return dist::part_of_whole(t, cut, group); });
    }
  }
  held_experts_.clear();
}

void MeshPlan::gather_experts() {
  torch::NoGradGuard no_grad;
  auto& group = *groups.expert;
  for (auto& w : expert_weights_) {  // in the same order on every rank
    w.set_data(dist::whole_of_part(w.detach(), experts_cut(w.size(0) * group.size()), group));
  }
  for (auto* moe : spread_layers_) moe->spread = {};
  expert_weights_.clear();
  spread_layers_.clear();
}

}  // namespace tandem::engine
