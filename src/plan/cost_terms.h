// Terms both of the planner's cost models use (layout_cost.cpp for the
// language models, image_cost.cpp for the image classifiers).
#pragma once

#include <cstdint>
#include <string>

namespace tandem::plan::internal {

constexpr double kBucketBytes = 25 << 20;  // DDP's bucket (--bucket-cap-mb 25)
// Note [usable memory]: a device's memory less what its runtime, the
// allocator's fragmentation and the collectives' own buffers take; 8% is
// what PyTorch's reserved-but-unallocated share typically is on long runs.
constexpr double kUsable = 0.92;

// What a ring puts on the wire for a collective's payload over n ranks
// (Note [planned traffic]).
inline double wire(const std::string& collective, double payload, int64_t n) {
  if (n <= 1) return 0;
  if (collective == "all_reduce") return 2.0 * double(n - 1) / double(n) * payload;
  if (collective == "reduce_scatter") return double(n - 1) / double(n) * payload;
  if (collective == "all_gather") return double(n - 1) * payload;
  return payload;
}

}  // namespace tandem::plan::internal
