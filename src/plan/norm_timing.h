// The calibration's timing of the work tensor parallelism does not divide
// (Note [replicated element-wise work]).
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/plan/device_profile.h"

namespace tandem::plan::internal {

// Note [replicated element-wise work]: tp cuts a layer's matrix products,
// its attention heads and its MLP's activations, but every rank of a tp
// group runs the layer's two norms and two residual adds on the whole
// [tokens x hidden] activation, forward and backward (sequence
// parallelism cuts them by the sequence). A fit of step time to FLOPs
// would plan that work as cut too. So the calibration times it apart at
// each size it times steps at, with RMSNorm and with LayerNorm (whose
// costs differ 2-3x here), takes it out of the steps it fits, and the
// planner adds it per rank for the elements that rank runs it on,
// interpolated between the sizes measured: a table, not a rate, since a
// call's dispatch makes the small sizes cost more than their share.

// Times both norms' layer on `cores` threads at once, at each of `tokens`
// rows of `hidden` (increasing): the medians, by elements.
std::vector<DeviceProfile::NormTiming> time_norms(int64_t hidden, const std::vector<int64_t>& tokens, int64_t cores,
                                                  int steps);

}  // namespace tandem::plan::internal
