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
  std::vector<std::vector<int64_t>> shapes, strides;  // per parameter, in the flat buffer
  torch::Tensor at_rest;  // what the parameters hold at rest: no elements
  FlatLayout layout;
  torch::Tensor full;   // the padded flat buffer (released at rest)
  torch::Tensor grad_flat;  // during its backward: the parameters' gradients are aliases of it
  torch::Tensor shard;  // this rank's slice: shards_[...]
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
  // The flat buffer's slice of parameter k (its position in this unit).
  torch::Tensor slot(const torch::Tensor& flat, size_t k) const {
    return flat.as_strided(shapes[k], strides[k], flat.storage_offset() + layout.offsets[k]);
  }
  // The same place as a tensor of its own, not an autograd view of `flat`
  // (a parameter's .grad(), which AccumulateGrad adds into in place).
  torch::Tensor alias(const torch::Tensor& flat, size_t k) const {
    auto t = torch::empty({0}, flat.options());
    t.set_(flat.storage(), flat.storage_offset() + layout.offsets[k], shapes[k], strides[k]);
    return t;
  }
};

}  // namespace tandem::parallel
