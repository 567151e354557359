// Note [split regions] (models/split_region.h).
#include "tandem/models/split_region.h"

#include <torch/torch.h>

#include "tandem/util/check.h"

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

torch::Tensor dropout_part(const torch::Tensor& x, double p, bool training, int64_t dim, int64_t whole, int64_t rank,
                           int64_t parts) {
  if (!training || p == 0) return x;
  auto sizes = x.sizes().vec();
  if (whole >= 0) sizes.at(static_cast<size_t>(dim)) = whole;
  // Contiguous, whatever x's strides: any rank fills it in one order.
  auto keep = torch::empty(sizes, x.options()).bernoulli_(1 - p);
  if (parts > 1) keep = keep.chunk(parts, dim).at(static_cast<size_t>(rank));
  TANDEM_CHECK(keep.sizes() == x.sizes(), "dropout: part ", rank, " of ", parts, " of a mask of ", sizes,
               " along dimension ", dim, " is ", keep.sizes(), ", the activation ", x.sizes());
  return x * keep.div(1 - p);
}

}  // namespace tandem::models
