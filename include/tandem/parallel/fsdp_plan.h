// tandem/parallel/fsdp_plan.h: how fully sharded data parallelism groups a
// model's layers into units and cuts each unit's parameters into shards.
//
// FSDP (fsdp.h) gathers the parameters of one unit at a time, so the plan
// decides both the peak memory (the largest unit, twice with prefetching)
// and the number of collectives (two all-gathers and one reduce-scatter per
// unit and step). Pure functions of the sizes, tested without processes.
//
// Units (PyTorch's size_based_auto_wrap_policy, over the layers that FSDP runs,
// Note [fsdp layers] in fsdp.h):
//  - the layers are taken in order; a unit is closed once it holds at least
//    min_unit_numel parameters;
//  - layers left after the last closed unit (pooling, flatten, a small
//    head) join that unit; with no closed unit at all, one unit holds
//    every layer;
//  - min_unit_numel 0 makes every layer a unit of its own.
//
// Flat layout (PyTorch's FlatParameter): a unit's parameters lie one after
// another in one flat buffer, each in its own memory order, padded at the
// end to a multiple of the world size; rank r holds elements
// [r * shard, (r + 1) * shard). A parameter may straddle two shards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::parallel {

struct FsdpUnitPlan {
  size_t begin = 0, end = 0;  // layers [begin, end)
  int64_t numel = 0;          // their parameters' elements
};

// `layer_numels`: parameters per layer, in order. Throws
// tandem::Error for a negative size or min_unit_numel.
std::vector<FsdpUnitPlan> plan_units(const std::vector<int64_t>& layer_numels, int64_t min_unit_numel);

struct FlatLayout {
  std::vector<int64_t> offsets;  // per parameter, its first element in the flat buffer
  int64_t numel = 0;             // the parameters' elements together
  int64_t padded = 0;            // numel rounded up to a multiple of the world size
  int64_t shard = 0;             // padded / world: the elements each rank holds
};

// `numels`: the unit's parameters in order. Throws tandem::Error for world
// < 1 or a negative size.
FlatLayout plan_flat(const std::vector<int64_t>& numels, int64_t world);

}  // namespace tandem::parallel
