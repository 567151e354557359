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
// compute, its copies and its collectives' latencies, since a ring's step
// waits for the peer to get a core. Measured here (torch.distributed over
// Gloo, 2 cores): a 64 KiB all-gather between computations (as in a
// step) took 1.4-2.2 ms more than they alone between 2 processes, 5.7-6.4
// ms among 4: twice its 3 ring steps at the latency 2 processes show.
// 1 where the ranks have a core each.
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
// the rank's core computes for another rank. Where ranks outnumber cores
// such a call's latency takes half the turns beyond the first,
// (1 + turns) / 2; its bytes, copied and summed on the busy cores, all of
// them. Fitted to runs (llama-tiny's FSDP on 4 ranks over 2 cores), not
// derived: whole turns planned its calls twice what they cost.
inline double prefetched_turns(const Job& job) { return (1.0 + turns(job)) / 2.0; }

// Seconds of a dimension's traffic over n ranks whose group spans `span`
// consecutive ranks (inside a node: its links; across: the network): each
// collective's ring bytes over the bandwidth, plus `calls` calls of
// `steps` ring steps at the link's latency; all of it taking turns (the
// latency of `prefetched` calls, in part).
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
  return t * turns(job) + latency * (prefetched ? prefetched_turns(job) : turns(job));
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
