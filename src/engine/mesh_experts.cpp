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

#include "tandem/engine/mesh_plan.h"
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

void MeshPlan::gather_experts() {
  torch::NoGradGuard no_grad;
  const auto& group = *groups.expert;
  for (auto& w : expert_weights_) {  // every rank of the group, in the same order
    std::vector<torch::Tensor> parts;
    for (int64_t r = 0; r < group.size(); ++r) parts.push_back(torch::empty_like(w));
    groups.expert->all_gather(parts, w.detach().contiguous()).wait();
    w.set_data(torch::cat(parts, 0));
  }
  for (auto* moe : spread_layers_) moe->spread = {};
  expert_weights_.clear();
  spread_layers_.clear();
}

}  // namespace tandem::engine
