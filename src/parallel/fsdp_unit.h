// One FSDP unit's state, shared by fsdp.cpp (gathers, forward, backward)
// and fsdp_state.cpp (full parameters, state gathered and cut into shards).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include <torch/torch.h>

#include "tandem/dist/process_group.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/parallel/fsdp_plan.h"

namespace tandem::parallel {

struct FullyShardedDataParallel::Unit {
  FsdpUnitPlan plan;
  std::vector<size_t> parameters;  // indices into parameters_
  std::vector<std::vector<int64_t>> shapes, strides;  // per parameter, in the full buffer (dim 0 outermost)
  torch::Tensor at_rest;  // what the parameters hold at rest: no elements
  ShardLayout layout;
  torch::Tensor full;       // each parameter whole, in its reserved rows (released at rest)
  torch::Tensor gathered;   // the all-gather's output, the ranks' blocks, until copied into `full`
  torch::Tensor grad_flat;  // during its backward: the parameters' gradients are aliases of it, laid out as `full`
  torch::Tensor block;      // this rank's block: its shards lie in it (shards_[...] are aliases)
  bool allocated = false;
  bool pinned = false;  // Note [fsdp tied weights]: holds a weight another unit's layers read
  bool gathering = false;
  dist::Work gather_work;
  // Launched reduce-scatters, waited for in after_backward().
  struct Pending {
    dist::Work work;
    torch::Tensor input, output;
  };
  std::vector<Pending> pending;

  bool empty() const { return parameters.empty(); }
  size_t nbytes() const { return static_cast<size_t>(layout.padded) * full.element_size(); }
  // The full buffer's slice of parameter k (its position in this unit).
  torch::Tensor slot(const torch::Tensor& flat, size_t k) const {
    return flat.as_strided(shapes[k], strides[k], flat.storage_offset() + layout.parameters[k].full_offset);
  }
  // The same place as a tensor of its own, not an autograd view of `flat`
  // (a parameter's .grad(), which AccumulateGrad adds into in place).
  torch::Tensor alias(const torch::Tensor& flat, size_t k) const {
    return alias_of(flat, layout.parameters[k].full_offset, shapes[k], strides[k]);
  }
  // Parameter k's reserved rows in a buffer laid out as `full` (all ranks'
  // chunks, padding included), as [world, chunk * row_numel].
  torch::Tensor rows(const torch::Tensor& flat, size_t k) const {
    const auto& p = layout.parameters[k];
    return flat.narrow(0, p.full_offset, layout.world * p.chunk * p.row_numel).view({layout.world, -1});
  }
  // Parameter k's chunks in the ranks' blocks, laid out as `gathered`, as
  // [world, chunk * row_numel].
  torch::Tensor chunks(const torch::Tensor& blocks, size_t k) const {
    const auto& p = layout.parameters[k];
    return blocks.view({layout.world, layout.shard}).narrow(1, p.shard_offset, p.chunk * p.row_numel);
  }
  // This rank's reserved rows of parameter k in a block, 1-D.
  torch::Tensor own_chunk(const torch::Tensor& block, size_t k) const {
    const auto& p = layout.parameters[k];
    return block.narrow(0, p.shard_offset, p.chunk * p.row_numel);
  }
  // Rank `rank`'s shard of parameter k: the parameter's shape with its
  // rows (a 0-dim parameter: [1] or [0]), and the parameter's strides.
  std::vector<int64_t> shard_shape(size_t k, int64_t rank) const {
    auto shape = shapes[k].empty() ? std::vector<int64_t>{1} : shapes[k];
    shape[0] = layout.rows_of(k, rank);
    return shape;
  }
  std::vector<int64_t> shard_strides(size_t k) const {
    return shapes[k].empty() ? std::vector<int64_t>{1} : strides[k];
  }
  // That shard in a block (this rank's, or one laid out alike), as a
  // tensor of its own.
  torch::Tensor shard_of(const torch::Tensor& block, size_t k, int64_t rank) const {
    return alias_of(block, layout.parameters[k].shard_offset, shard_shape(k, rank), shard_strides(k));
  }
  // The elements of the parameter's memory (its strides) that rank
  // `rank`'s shard holds start here (dim 0 outermost: one run).
  int64_t shard_start(size_t k, int64_t rank) const {
    return layout.first_row(k, rank) * layout.parameters[k].row_numel;
  }
  int64_t shard_numel(size_t k, int64_t rank) const {
    return layout.rows_of(k, rank) * layout.parameters[k].row_numel;
  }

  static torch::Tensor alias_of(const torch::Tensor& flat, int64_t offset, c10::IntArrayRef shape,
                                c10::IntArrayRef strides) {
    auto t = torch::empty({0}, flat.options());
    t.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
    return t;
  }
};

}  // namespace tandem::parallel
