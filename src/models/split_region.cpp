// Note [split regions] (models/split_region.h).
#include "tandem/models/split_region.h"

#include <torch/torch.h>

namespace tandem::models {

torch::Tensor SplitLookup::lookup(const torch::Tensor& weight, const torch::Tensor& tokens) const {
  if (!split()) return torch::embedding(weight, tokens);
  const auto elsewhere = (tokens < begin).logical_or(tokens >= begin + weight.size(0));
  const auto local = (tokens - begin).masked_fill(elsewhere, 0);
  return leave(torch::embedding(weight, local).masked_fill(elsewhere.unsqueeze(-1), 0));
}

torch::Tensor SplitLookup::positions(const torch::Tensor& all) const {
  return sequence_parts == 1 ? all : all.chunk(sequence_parts, 0)[sequence_rank];
}

}  // namespace tandem::models
