#include "tandem/dist/placement.h"

#include <algorithm>
#include <numeric>

#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/util/check.h"

namespace tandem::dist {

Placement Placement::shard(int64_t dim, int64_t whole_size) {
  TANDEM_CHECK(dim >= 0 && whole_size >= 0, "Placement: a shard along dimension ", dim, " of ", whole_size, " rows");
  Placement p;
  p.kind = Kind::kShard;
  p.dim = dim;
  p.whole_size = whole_size;
  return p;
}

Placement Placement::shard(int64_t dim, int64_t whole_size, std::vector<torch::Tensor> rows) {
  auto p = shard(dim, whole_size);
  int64_t total = 0;
  for (const auto& r : rows) {
    TANDEM_CHECK(r.dim() == 1 && r.scalar_type() == torch::kLong, "Placement: a shard's rows must be 1-D int64");
    total += r.numel();
  }
  TANDEM_CHECK(total == whole_size, "Placement: the ranks' rows number ", total, ", not the whole's ", whole_size);
  p.rows = std::make_shared<const std::vector<torch::Tensor>>(std::move(rows));
  return p;
}

torch::Tensor Placement::rows_of(int64_t rank, int64_t ranks) const {
  TANDEM_CHECK(is_shard(), "Placement: rows of a ", str(), " placement");
  if (rows) {
    TANDEM_CHECK(static_cast<int64_t>(rows->size()) == ranks, "Placement: ", rows->size(), " ranks' rows for ",
                 ranks, " ranks");
    return (*rows)[rank];
  }
  // torch.chunk: pieces of ceil(whole / ranks) rows, the last ones shorter or empty.
  const int64_t piece = (whole_size + ranks - 1) / std::max<int64_t>(ranks, 1);
  const int64_t begin = std::min(whole_size, rank * piece);
  const int64_t end = std::min(whole_size, begin + piece);
  return torch::arange(begin, end, torch::kLong);
}

std::string Placement::str() const {
  switch (kind) {
    case Kind::kReplicate:
      return "Replicate()";
    case Kind::kShard:
      return "Shard(" + std::to_string(dim) + ")";
    case Kind::kPartial:
      return "Partial(sum)";
  }
  return "?";
}

torch::Tensor in_memory_order(const torch::Tensor& t) {
  if (t.is_contiguous()) return t.view({-1});
  TANDEM_CHECK(t.is_non_overlapping_and_dense(), "placements: a tensor of shape ", t.sizes(), " and strides ",
               t.strides(), " is not dense; its elements are no run of memory");
  std::vector<int64_t> order(static_cast<size_t>(t.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return t.permute(order).view({-1});
}

torch::Tensor PlacedTensor::value() const {
  return flat_numel < 0 ? tensor : in_memory_order(tensor).narrow(0, flat_offset, flat_numel);
}

torch::Tensor PlacedTensor::grad() const {
  const auto& g = tensor.grad();
  if (!g.defined() || flat_numel < 0) return g;
  return in_memory_order(g).narrow(0, flat_offset, flat_numel);
}

ProcessGroup* PlacementMesh::sum_group() const {
  const bool stages = spans(pipeline), parts = sums_over_tensor(), shards = sums_over_data();
  if (shards) return stages || parts || spans(data_replicate) ? job.get() : data.get();
  if (stages && parts) return model.get();
  if (stages) return pipeline.get();
  if (parts) return tensor.get();
  return nullptr;
}

bool counted_here(const PlacedTensor& t, const PlacementMesh& mesh) {
  for (const auto* p : {&t.data_parallel, &t.tensor_parallel}) {
    TANDEM_CHECK(!p->is_partial(), "placements: ", t.name,
                 " is a pending sum (Partial) where a whole value was expected; reduce it first");
  }
  if (!t.owned) return false;
  if (mesh.sums_over_data() && PlacementMesh::coordinate(mesh.data_replicate) != 0) return false;
  if (mesh.sums_over_data() && t.data_parallel.is_replicate() && PlacementMesh::coordinate(mesh.data) != 0) return false;
  if (mesh.sums_over_tensor() && t.tensor_parallel.is_replicate() && PlacementMesh::coordinate(mesh.tensor) != 0) {
    return false;
  }
  return true;
}

CountedGradients counted_gradients(const std::vector<PlacedTensor>& tensors, const PlacementMesh& mesh) {
  CountedGradients out;
  for (const auto& t : tensors) {
    auto g = t.grad();
    if (!g.defined()) continue;
    (counted_here(t, mesh) ? out.counted : out.others).push_back(g);
  }
  return out;
}

namespace {

std::vector<torch::Tensor> partial_gradients(const std::vector<PlacedTensor>& pieces,
                                             Placement PlacedTensor::*dimension) {
  std::vector<torch::Tensor> grads;
  for (const auto& t : pieces) {
    if ((t.*dimension).is_partial()) {
      auto g = t.grad();
      if (g.defined()) grads.push_back(g);
    }
  }
  return grads;
}

}  // namespace

void sum_partial_gradients(const std::vector<PlacedTensor>& pieces, Placement PlacedTensor::*dimension,
                           ProcessGroup& group) {
  if (group.size() == 1) return;
  auto grads = partial_gradients(pieces, dimension);
  if (grads.empty()) return;
  std::vector<torch::Tensor> flat_grads;
  for (const auto& g : grads) flat_grads.push_back(g.reshape({-1}));
  auto flat = torch::cat(flat_grads);
  group.all_reduce(flat).wait();
  int64_t at = 0;
  for (auto& g : grads) {
    g.copy_(flat.narrow(0, at, g.numel()).view_as(g));
    at += g.numel();
  }
}

bool same_pieces(const std::vector<PlacedTensor>& pieces, Placement PlacedTensor::*dimension, ProcessGroup& group) {
  std::vector<int64_t> sizes;
  for (const auto& t : pieces) {
    if ((t.*dimension).is_partial()) {
      sizes.push_back(t.parameter_offset);
      sizes.push_back(t.value().numel());
    }
  }
  return same_on_every_rank(sizes, group);
}

torch::Tensor part_of_whole(const torch::Tensor& whole, const Placement& placement, const ProcessGroup& group) {
  if (!placement.is_shard()) return whole;
  TANDEM_CHECK(whole.dim() > placement.dim && whole.size(placement.dim) == placement.whole_size, "placements: a tensor of ",
               whole.sizes(), " in place of a whole of ", placement.whole_size, " along dimension ", placement.dim);
  const auto rows = placement.rows_of(group.rank(), group.size()).to(whole.device());
  return whole.index_select(placement.dim, rows);
}

torch::Tensor whole_of_part(const torch::Tensor& part, const Placement& placement, ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  if (placement.is_replicate() || group.size() == 1) return part.clone();
  if (placement.is_partial()) {
    auto sum = part.clone();
    group.all_reduce(sum).wait();
    return sum;
  }
  const int64_t ranks = group.size(), dim = placement.dim;
  int64_t longest = 0;
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < ranks; ++r) {
    rows.push_back(placement.rows_of(r, ranks));
    longest = std::max(longest, rows.back().numel());
  }
  TANDEM_CHECK(part.dim() > dim && part.size(dim) == rows[group.rank()].numel(), "placements: this rank's part of ",
               part.sizes(), " does not hold its ", rows[group.rank()].numel(), " rows along dimension ", dim);
  // Equal shapes for the all-gather: each part padded to the longest.
  auto sizes = part.sizes().vec();
  sizes[dim] = longest;
  auto padded = torch::zeros(sizes, part.options());
  padded.narrow(dim, 0, part.size(dim)).copy_(part);
  std::vector<torch::Tensor> parts;
  for (int64_t r = 0; r < ranks; ++r) parts.push_back(torch::empty_like(padded));
  group.all_gather(parts, padded).wait();
  sizes[dim] = placement.whole_size;
  auto whole = torch::empty(sizes, part.options());
  for (int64_t r = 0; r < ranks; ++r) {
    whole.index_copy_(dim, rows[r].to(whole.device()), parts[r].narrow(dim, 0, rows[r].numel()));
  }
  return whole;
}

}  // namespace tandem::dist
