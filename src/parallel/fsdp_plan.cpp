#include "tandem/parallel/fsdp_plan.h"

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

FlatLayout plan_flat(const std::vector<int64_t>& numels, int64_t world) {
  TANDEM_CHECK(world >= 1, "FSDP: expected a world size >= 1, got ", world);
  FlatLayout layout;
  for (size_t i = 0; i < numels.size(); ++i) {
    TANDEM_CHECK(numels[i] >= 0, "FSDP: parameter ", i, " has a negative size ", numels[i]);
    layout.offsets.push_back(layout.numel);
    layout.numel += numels[i];
  }
  layout.shard = (layout.numel + world - 1) / world;
  layout.padded = layout.shard * world;
  return layout;
}

}  // namespace tandem::parallel
