#include "tandem/engine/expert_load.h"

#include <torch/torch.h>

#include "tandem/models/moe.h"

namespace tandem::engine {

int64_t count_experts(models::Sequence& model) {
  for (const auto& m : model->modules(/*include_self=*/false)) {
    if (const auto* moe = dynamic_cast<const models::SparseMoeImpl*>(m.get())) return moe->config().num_experts;
  }
  return 0;
}

ExpertLoad take_expert_load(models::Sequence& model, int64_t num_experts, dist::ProcessGroup* job, bool counted) {
  // [pairs per expert, probability sums per expert, rows], every layer's added.
  auto sums = torch::zeros({2 * num_experts + 1}, torch::kFloat64);
  for (const auto& r : models::take_router_records(*model)) {
    if (!counted) continue;
    sums.slice(0, 0, num_experts) += r.tokens_per_expert;
    sums.slice(0, num_experts, 2 * num_experts) += r.probability_sum;
    sums[2 * num_experts] += static_cast<double>(r.rows);
  }
  if (job) {
    auto wire = sums.to(job->wire_device());
    job->all_reduce(wire, dist::ReduceOp::kSum).wait();
    sums = wire.cpu();
  }
  ExpertLoad load;
  const double rows = sums[2 * num_experts].item<double>();
  if (rows == 0) return load;
  models::RouterRecord all{sums.slice(0, 0, num_experts), sums.slice(0, num_experts, 2 * num_experts),
                           static_cast<int64_t>(rows)};
  load.balance_loss = models::load_balancing_loss({all}, num_experts);
  const auto pairs = all.tokens_per_expert / all.tokens_per_expert.sum();
  load.share.assign(pairs.data_ptr<double>(), pairs.data_ptr<double>() + num_experts);
  return load;
}

}  // namespace tandem::engine
