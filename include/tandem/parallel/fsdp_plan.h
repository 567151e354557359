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
// Shards (PyTorch's FSDP2): every parameter is cut along its first
// dimension into torch.chunk's pieces, ceil(rows / world) rows a rank (the
// last ranks fewer, or none), so a rank's shard of a parameter is a tensor
// of the parameter's shape but for its rows: Shard(0). Each rank keeps its
// shards of a unit one after another in one block (each padded to the full
// ceil(rows / world) rows), so the unit is gathered with one all-gather of
// the blocks and reduced with one reduce-scatter; the parameters are copied
// out of the gathered blocks into a buffer that holds each whole, and the
// gradients copied into blocks again. A 0-dim parameter counts as one row.
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

struct ShardLayout {
  struct Parameter {
    int64_t rows = 0;         // along dim 0 (1 for a 0-dim parameter)
    int64_t row_numel = 0;    // the elements of one row
    int64_t chunk = 0;        // rows per rank: ceil(rows / world)
    int64_t full_offset = 0;  // its first element in the gathered buffer (world * chunk rows reserved)
    int64_t shard_offset = 0; // its first element in a rank's block (chunk rows reserved)
  };
  std::vector<Parameter> parameters;
  int64_t world = 1;
  int64_t numel = 0;   // the parameters' elements together
  int64_t shard = 0;   // the elements of each rank's block
  int64_t padded = 0;  // world * shard: the gathered buffer
  // The rows of parameter k that `rank` holds (torch.chunk: 0 past the end).
  int64_t rows_of(size_t k, int64_t rank) const;
  // The first of them.
  int64_t first_row(size_t k, int64_t rank) const;
};

// `shapes`: the unit's parameters in order. Throws tandem::Error for world
// < 1 or a negative size.
ShardLayout plan_shards(const std::vector<std::vector<int64_t>>& shapes, int64_t world);

}  // namespace tandem::parallel
