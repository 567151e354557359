// Terms both of the planner's cost models use (layout_cost.cpp for the
// language models, image_cost.cpp for the image classifiers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "tandem/plan/layout_cost.h"

namespace tandem::plan::internal {

constexpr double kBucketBytes = 25 << 20;  // DDP's bucket (--bucket-cap-mb 25)
// Note [usable memory]: a device's memory less what its runtime, the
// allocator's fragmentation and the collectives' own buffers take; 8% is
// what PyTorch's reserved-but-unallocated share typically is on long runs.
constexpr double kUsable = 0.92;

// A CPU's ranks talk over Gloo, whose reduce-scatter is an all-reduce of
// the whole buffer (Note [reduce-scatter over Gloo] in process_group.cpp);
// a GPU's over NCCL, whose is a ring's.
inline bool over_gloo(const DeviceProfile& dev) { return dev.cores > 0; }

// What a ring puts on the wire for a collective's payload over n ranks
// (Note [planned traffic]).
inline double wire(const std::string& collective, double payload, int64_t n, bool gloo = false) {
  if (n <= 1) return 0;
  if (collective == "all_reduce" || (gloo && collective == "reduce_scatter")) {
    return 2.0 * double(n - 1) / double(n) * payload;
  }
  if (collective == "reduce_scatter") return double(n - 1) / double(n) * payload;
  if (collective == "all_gather") return double(n - 1) * payload;
  return payload;
}

// Note [ranks that take turns]: on a CPU whose node runs more ranks than
// it has cores, everything a rank does takes turns with the others: its
// compute and its copies. 1 where the ranks have a core each. Its calls'
// latencies, measured between computations (Note [links timed between
// products] in calibrate.cpp), take half the turns beyond the first
// (latency_turns): a ring's step waits for its peer to get a core, but a
// waiting rank gives its own core up. Measured here (torch.distributed
// over Gloo, 2 cores): a 64 KiB all-gather between computations, 5.7-6.4
// ms among 4 processes for its 3 ring steps, ~2 ms a step against the
// 1.4 ms a step that 2 processes show.
inline double turns(const Job& job) {
  const auto& dev = job.device;
  return dev.cores > 0 ? std::max(1.0, double(job.gpus_per_node) / double(dev.cores)) : 1.0;
}

// Note [replicated element-wise work] (norm_timing.h): seconds of a
// rank's layer norms and residual adds, `layers` of them on activations of
// `elements` (tokens x hidden) each, at the profile's float32 timings
// scaled by the element's bytes (memory-bound work); taking turns like the
// rest of its compute.
inline double replicated_seconds(const Job& job, double layers, double elements, double element_bytes) {
  return layers * job.device.norm_seconds(job.model.llama, elements) * element_bytes / 4.0 * turns(job);
}

// Note [prefetched calls that take turns]: FSDP launches each call a
// unit ahead of its use (a unit's gather before the unit before it runs,
// its reduce-scatter settled after the next unit's backward), so a ring
// step that waits for a peer without a core waits on Gloo's thread while
// the rank's core computes for another rank: such a call's latency takes
// no turns, and it pays no overhead of a call waited for between
// computations; its bytes, copied and summed on the busy cores, take
// every turn. Measured (llama-tiny's FSDP, 4 ranks over 2 cores): its 11
// prefetched calls waited 40-50 ms a step in all, its 2 calls when
// nothing is prefetched (one unit) 32-42 ms.
inline double latency_turns(const Job& job, bool prefetched) {
  return prefetched ? 1.0 : (1.0 + turns(job)) / 2.0;
}

// Seconds of a dimension's traffic over n ranks whose group spans `span`
// consecutive ranks (inside a node: its links; across: the network): each
// collective's ring bytes over the bandwidth, plus `calls` calls of
// `steps` ring steps at the link's latency, each call's overhead between
// computations unless `prefetched`; taking turns (Note [ranks that take
// turns], [prefetched calls that take turns]).
inline double collective_seconds(const Job& job, const std::map<std::string, double>& bytes, int64_t n,
                                 int64_t span, double calls, double steps, bool prefetched = false) {
  if (n <= 1) return 0;
  const auto& dev = job.device;
  const bool intra = span <= job.gpus_per_node;
  double t = 0;
  for (const auto& [collective, b] : bytes) {
    t += wire(collective, b, n, over_gloo(dev)) / (intra ? dev.intra_node_bandwidth : dev.inter_node_bandwidth);
  }
  const double latency = calls * steps * (intra ? dev.intra_node_latency : dev.inter_node_latency);
  // A call waited for at once pays what a call between computations costs
  // more than one in a quiet loop (Note [links timed between products] in
  // calibrate.cpp); a prefetched one's wait passes under the computation.
  const double waited = prefetched ? 0.0 : calls * dev.call_overhead;
  return t * turns(job) + latency * latency_turns(job, prefetched) + waited;
}

// Ring steps a call: an all-reduce's 2 (n - 1); an all-gather's n - 1 but
// no fewer than 2 (a call's own handshakes are the floor); a
// reduce-scatter's as an all-gather's, or over Gloo an all-reduce's.
inline double all_reduce_steps(int64_t n) { return 2.0 * double(n - 1); }
inline double all_gather_steps(int64_t n) { return std::max(2.0, double(n - 1)); }
inline double reduce_scatter_steps(const Job& job, int64_t n) {
  return over_gloo(job.device) ? all_reduce_steps(n) : all_gather_steps(n);
}
// FSDP's calls, a unit's two gathers and its reduce-scatter, on average.
inline double fsdp_steps(const Job& job, int64_t n) {
  return (2.0 * all_gather_steps(n) + reduce_scatter_steps(job, n)) / 3.0;
}

// What of the data dimension's t_dp seconds a step waits for. DDP's
// buckets overlap the last micro-batch's backward (two thirds of its
// compute); FSDP's gathers and reductions (`calls` a step) are prefetched
// under the step's compute but the first gather. On a CPU whose cores all
// compute, nothing is left to move the bytes meanwhile: all of it.
inline double exposed_data_seconds(const Job& job, double t_dp, double compute, int64_t micro_batches,
                                   bool sharded, double calls) {
  const auto& dev = job.device;
  if (dev.cores > 0 && job.gpus_per_node >= dev.cores) return t_dp;
  if (sharded) return std::max(0.0, t_dp - compute) + t_dp / std::max(1.0, calls);
  return std::max(0.0, t_dp - 2.0 / 3.0 * compute / double(micro_batches));
}

}  // namespace tandem::plan::internal
