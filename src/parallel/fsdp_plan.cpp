#include "tandem/parallel/fsdp_plan.h"

#include <algorithm>

#include "tandem/util/check.h"

namespace tandem::parallel {

std::vector<FsdpUnitPlan> plan_units(const std::vector<int64_t>& layer_numels, int64_t min_unit_numel) {
  TANDEM_CHECK(min_unit_numel >= 0, "FSDP: the smallest unit must be >= 0 parameters, got ", min_unit_numel);
  std::vector<FsdpUnitPlan> units;
  FsdpUnitPlan open;
  for (size_t i = 0; i < layer_numels.size(); ++i) {
    TANDEM_CHECK(layer_numels[i] >= 0, "FSDP: layer ", i, " has a negative size ", layer_numels[i]);
    open.end = i + 1;
    open.numel += layer_numels[i];
    if (open.numel >= min_unit_numel) {
      units.push_back(open);
      open = FsdpUnitPlan{i + 1, i + 1, 0};
    }
  }
  if (open.end > open.begin) {  // what is left joins the last unit, or is the only one
    if (units.empty()) {
      units.push_back(open);
    } else {
      units.back().end = open.end;
      units.back().numel += open.numel;
    }
  }
  return units;
}

int64_t ShardLayout::first_row(size_t k, int64_t rank) const {
  const auto& p = parameters.at(k);
  return std::min(p.rows, rank * p.chunk);
}

int64_t ShardLayout::rows_of(size_t k, int64_t rank) const {
  const auto& p = parameters.at(k);
  return std::min(p.rows, (rank + 1) * p.chunk) - first_row(k, rank);
}

ShardLayout plan_shards(const std::vector<std::vector<int64_t>>& shapes, int64_t world) {
  TANDEM_CHECK(world >= 1, "FSDP: expected a world size >= 1, got ", world);
  ShardLayout layout;
  layout.world = world;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ShardLayout::Parameter p;
    p.rows = shapes[i].empty() ? 1 : shapes[i][0];
    p.row_numel = 1;
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      TANDEM_CHECK(shapes[i][d] >= 0, "FSDP: parameter ", i, " has a negative size ", shapes[i][d]);
      if (d > 0) p.row_numel *= shapes[i][d];
    }
    p.chunk = (p.rows + world - 1) / world;
    p.full_offset = layout.padded;
    p.shard_offset = layout.shard;
    layout.numel += p.rows * p.row_numel;
    layout.shard += p.chunk * p.row_numel;
    layout.padded += world * p.chunk * p.row_numel;
    layout.parameters.push_back(p);
  }
  return layout;
}

}  // namespace tandem::parallel
