// tandem/engine/expert_load.h: how a mixture of experts spread the tokens
// over its experts since the last record, over the whole job, for the
// logs (TensorBoard's router/ scalars).
//
// Each rank's routers count what they routed in training forwards
// (models::SparseMoe::take_routing); the counts of its layers and tokens
// are summed over the job: over the data ranks (their tokens), the
// pipeline's stages (their layers) and, once, over the tp ranks (which
// route the same tokens alike). The balancing loss is then transformers'
// load_balancing_loss_func over every layer and token of the interval.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/dist/process_group.h"
#include "tandem/models/sequence.h"

namespace tandem::engine {

struct ExpertLoad {
  // transformers' load-balancing loss (models::load_balancing_loss): 1 for
  // a uniform spread at any k, up to the number of experts.
  double balance_loss = 0.0;
  // Per expert, its share of the (token, expert) pairs over the layers
  // (they sum to 1).
  std::vector<double> share;
  bool empty() const { return share.empty(); }
};

// The experts a model's MoE layers have (0: a model without experts).
int64_t count_experts(models::Sequence& model);

// Takes this rank's routing records from `model` and sums them over `job`
// (a collective of every rank of the job, null for one process);
// `counted`: whether this rank's records join the sum (false on every tp
// rank but the first). Empty where the interval routed no token.
ExpertLoad take_expert_load(models::Sequence& model, int64_t num_experts, dist::ProcessGroup* job, bool counted);

}  // namespace tandem::engine
