// tandem/plan/planner.h: every layout tandem can run a job in, each with
// its cost (layout_cost.h), best first (tandem plan).
//
// Note [planned time]: a rank's step is its share of the model's FLOPs
// (forward and backward, a third more with every layer recomputed) at the
// profile's peak times its efficiency, plus its layers' overhead a
// micro-batch (the profile's layer_overhead) and their norms and residual
// adds on the elements it runs them on (Note [replicated element-wise
// work] in src/plan/norm_timing.h), plus the communication that
// is not hidden: tp's all-reduces (between the layers' products), a
// pipeline's sends, DDP's buckets beyond the last micro-batch's backward,
// FSDP's transfers beyond the step's compute and its first gather, all of
// dp's on a CPU whose cores all compute (each a ring's bytes over the
// link's bandwidth plus its steps' latencies: 2 (n - 1) an all-reduce, at
// least 2 a call, a reduce-scatter over Gloo an all-reduce's; over NVLink
// inside a node, the network across); divided by 1 - the bubble of the
// schedule replayed with backward twice forward. Where a CPU's ranks
// outnumber its cores all of it takes turns (Note [ranks that take
// turns]) and the bubble's idle cores go to the busy ranks (Note
// [bubbles that other ranks fill]). Tokens/s is the global batch's tokens
// over it, MFU the model's FLOPs a second over the job's peak.
#pragma once

#include <string>
#include <vector>

#include "tandem/plan/layout_cost.h"

namespace tandem::plan {

struct PlanOptions {
  std::string mesh;  // --mesh: only layouts of this shape (its words, as Layout::mesh() writes them)
  bool recompute_both = true;  // with and without activation checkpointing
  // Settings every layout takes (Layout's fields of the same names).
  int64_t fsdp_min_unit = int64_t(1) << 17;
  bool fsdp_reshard = true;
  bool allreduce = false;
};

// The layouts of `job` over its ranks: tp over a node's ranks dividing the
// heads and key/value heads; cp dividing the rest, with 2 cp dividing the
// sequence; pp dividing the rest, at most the layers; dp the rest, dividing
// the global batch; DDP, ZeRO-1, FSDP, and HSDP (a node's dp ranks a shard
// group) when dp spans nodes; for a mixture of experts, ep dividing the
// experts and dp x cp, under DDP; sequence parallelism with tp; activation checkpointing off and on; micro-batches of 1, 2,
// 4, ... sequences (a pipeline's, or gradient accumulation's). Best first:
// the layouts that fit by tokens/s, then the others by shortfall.
std::vector<LayoutCost> plan_layouts(const Job& job, const PlanOptions& options = {});

}  // namespace tandem::plan
