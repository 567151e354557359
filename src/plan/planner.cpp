// Every layout of a job, each with its cost, best first (planner.h).
#include "tandem/plan/planner.h"

#include <algorithm>
#include <utility>

#include "tandem/util/check.h"

namespace tandem::plan {
namespace {

std::vector<int64_t> divisors(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k <= n; ++k) {
    if (n % k == 0) out.push_back(k);
  }
  return out;
}

// Best first: the layouts that fit by tokens/s, then the others by shortfall.
std::vector<LayoutCost> sorted(std::vector<LayoutCost> out) {
  std::stable_sort(out.begin(), out.end(), [](const LayoutCost& a, const LayoutCost& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.tokens_per_second > b.tokens_per_second : a.shortfall < b.shortfall;
  });
  return out;
}

// `l` with the settings every layout takes, and its cost, unless --mesh
// asks for another shape.
void add_layout(const Job& job, const PlanOptions& options, Layout l, std::vector<LayoutCost>& out) {
  l.fsdp_min_unit = options.fsdp_min_unit;
  l.fsdp_reshard = options.fsdp_reshard;
  l.allreduce = options.allreduce && l.data == DataSharding::kDdp;
  if (!options.mesh.empty() && l.mesh() != options.mesh) return;
  out.push_back(layout_cost(job, l));
}

// An image classifier's: every rank a dp rank (Note [measured image models]),
// DDP, ZeRO-1, FSDP, and HSDP across nodes; micro-batches of 1, 2, 4, ...
// images (gradient accumulation).
std::vector<LayoutCost> plan_image_layouts(const Job& job, const PlanOptions& options) {
  std::vector<LayoutCost> out;
  const int64_t dp = job.world();
  if (job.global_batch % dp != 0) return out;
  const int64_t local = job.global_batch / dp;
  std::vector<DataSharding> shardings{DataSharding::kDdp};
  if (dp > 1) {
    shardings.push_back(DataSharding::kZero1);
    shardings.push_back(DataSharding::kFsdp);
  }
  if (dp > job.gpus_per_node && job.gpus_per_node > 1) shardings.push_back(DataSharding::kHsdp);
  for (auto data : shardings) {
    for (int64_t micro = 1; micro <= local; micro *= 2) {
      if (local % micro != 0) continue;
      Layout l;
      l.dp = dp;
      l.data = data;
      l.dp_shard = data == DataSharding::kHsdp ? job.gpus_per_node : 0;
      l.micro_batch = micro;
      l.micro_batches = local / micro;
      add_layout(job, options, l, out);
    }
  }
  return out;
}

}  // namespace

std::vector<LayoutCost> plan_layouts(const Job& job, const PlanOptions& options) {
  const auto& m = job.model;
  TANDEM_CHECK_USAGE(job.global_batch > 0, "a global batch of at least one sequence is needed");
  std::vector<LayoutCost> out;
  if (m.image) return sorted(plan_image_layouts(job, options));
  for (int64_t tp : divisors(job.gpus_per_node)) {
    if (m.heads % tp != 0 || m.kv_heads % tp != 0) continue;
    for (int64_t cp : divisors(job.world() / tp)) {
      if (job.seq_len % (2 * cp) != 0) continue;  // two chunks a rank (Note [context parallelism])
      for (int64_t pp : divisors(job.world() / (tp * cp))) {
        if (pp > m.layers) continue;
        const int64_t dp = job.world() / (tp * cp * pp);
        if (job.global_batch % dp != 0) continue;
        const int64_t local = job.global_batch / dp;
        std::vector<DataSharding> shardings{DataSharding::kDdp};
        if (dp * cp > 1) {
          shardings.push_back(DataSharding::kZero1);
          shardings.push_back(DataSharding::kFsdp);
        }
        // A node's dp ranks (the mesh's dp runs inside pp, cp and tp inside dp).
        const int64_t node_dp = job.gpus_per_node / (tp * cp);
        if (dp * cp * tp > job.gpus_per_node && node_dp > 1 && dp % node_dp == 0) {
          shardings.push_back(DataSharding::kHsdp);
        }
        // Expert parallelism: ep dividing the experts and the data ranks,
        // under DDP (as tandem train runs it).
        std::vector<std::pair<int64_t, DataSharding>> choices;
        for (int64_t ep : divisors(dp * cp)) {
          if (ep > 1 && (m.experts == 0 || m.experts % ep != 0)) continue;
          for (auto data : shardings) {
            if (ep == 1 || data == DataSharding::kDdp) choices.emplace_back(ep, data);
          }
        }
        for (const auto& [ep, data] : choices) {
          // Sequence parallelism cuts a rank's tokens of each sequence in tp parts.
          const bool sp_fits = tp > 1 && (job.seq_len / cp) % tp == 0;
          for (bool sp : sp_fits ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
            for (bool recompute : options.recompute_both ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
              for (int64_t micro = 1; micro <= local; micro *= 2) {
                if (local % micro != 0) continue;
                Layout l;
                l.dp = dp;
                l.pp = pp;
                l.tp = tp;
                l.cp = cp;
                l.ep = ep;
                l.sequence_parallel = sp;
                l.data = data;
                l.dp_shard = data == DataSharding::kHsdp ? node_dp : 0;
                l.recompute = recompute;
                l.micro_batch = micro;
                l.micro_batches = local / micro;
                add_layout(job, options, l, out);
              }
            }
          }
        }
      }
    }
  }
  return sorted(std::move(out));
}

}  // namespace tandem::plan
