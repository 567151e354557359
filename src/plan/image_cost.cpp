// One layout's cost for an image classifier (image_cost.h): the data
// strategies over dp ranks, with gradient accumulation.
#include "image_cost.h"

#include <algorithm>
#include <cmath>

#include "cost_terms.h"
#include "tandem/parallel/fsdp_plan.h"
#include "tandem/util/check.h"

namespace tandem::plan::internal {
namespace {

// A unit's elements a rank holds, and the gathered buffer's (each
// parameter padded to whole rows a rank: parallel::plan_shards).
struct UnitShard {
  double shard = 0, padded = 0, numel = 0;
};

std::vector<UnitShard> unit_shards(const ImageShape& s, int64_t min_unit, int64_t ranks) {
  std::vector<UnitShard> out;
  for (const auto& unit : parallel::plan_units(s.layer_numels, min_unit)) {
    std::vector<std::vector<int64_t>> shapes;
    for (size_t layer = unit.begin; layer < unit.end; ++layer) {
      shapes.insert(shapes.end(), s.layer_shapes[layer].begin(), s.layer_shapes[layer].end());
    }
    const auto layout = parallel::plan_shards(shapes, ranks);
    out.push_back({double(layout.shard), double(layout.padded), double(layout.numel)});
  }
  return out;
}

}  // namespace

LayoutCost image_layout_cost(const Job& job, const Layout& l) {
  const auto& m = job.model;
  const auto& s = *m.image;
  const auto& dev = job.device;
  TANDEM_CHECK(l.pp == 1 && l.tp == 1 && l.cp == 1 && l.ep == 1 && !l.recompute && !l.sequence_parallel,
               "layout ", l.mesh(), ": an image classifier is planned over data-parallel ranks only");
  TANDEM_CHECK(l.dp == job.world(), "layout ", l.mesh(), " does not lay out ", job.world(), " ranks");
  TANDEM_CHECK(l.micro_batch * l.micro_batches * l.dp == job.global_batch, "layout ", l.mesh(), ": ",
               l.micro_batches, " micro-batches of ", l.micro_batch, " on ", l.dp,
               " dp ranks are not the global batch of ", job.global_batch);
  LayoutCost c;
  c.layout = l;
  const double w = job.precision == Precision::kFloat64 ? 8 : 4;
  const double params = double(m.parameters());
  const bool sharded = l.data == DataSharding::kFsdp || l.data == DataSharding::kHsdp;
  const int64_t shard_ranks = l.data == DataSharding::kHsdp ? l.dp_shard : l.dp;
  const double states = job.optimizer == OptimizerKind::kAdamW ? 2 : job.optimizer == OptimizerKind::kSgdMomentum ? 1 : 0;

  Memory mem;
  std::vector<UnitShard> units;
  if (sharded) units = unit_shards(s, l.fsdp_min_unit, shard_ranks);
  if (sharded) {
    double shard = 0, largest = 0;
    for (const auto& u : units) {
      shard += u.shard;
      largest = std::max(largest, u.padded);
    }
    mem.parameters = shard * w;
    mem.gradients = shard * w;
    mem.optimizer = states * shard * w;
    // A unit whole with its gradients in backward while the next one is
    // gathered (prefetch): three of the largest unit.
    mem.buffers = 3 * largest * w;
  } else {
    mem.parameters = params * w;
    mem.gradients = params * w;
    mem.optimizer = states * params * w / double(l.data == DataSharding::kZero1 ? l.dp : 1);
    // DDP's gradients are views of its flat buckets (Note [gradients are
    // bucket views] in engine/ddp_plan.cpp): the buckets are the gradients.
  }
  mem.parameters += s.buffer_bytes;
  mem.activations = s.activation_bytes_fixed + s.activation_bytes_per_sample * double(l.micro_batch);
  c.memory = mem;
  c.stage_memory.push_back(mem);

  // Traffic (Note [planned traffic]); BatchNorm's statistics broadcast from
  // rank 0 once a step, at its first forward.
  std::map<std::string, std::map<std::string, double>> bytes;
  const double mb = double(l.micro_batches);
  if (l.dp > 1) {
    auto& dp = bytes["dp"];
    if (sharded) {
      double shard = 0, padded = 0, last = units.empty() ? 0 : units.back().shard;
      for (const auto& u : units) {
        shard += u.shard;
        padded += u.padded;
      }
      dp["all_gather"] = mb * (l.fsdp_reshard ? 2 * shard - last : shard) * w;
      dp["reduce_scatter"] = mb * padded * w;
      if (l.data == DataSharding::kHsdp && l.dp > shard_ranks) dp["all_reduce"] = mb * shard * w;
      if (s.buffer_bytes > 0) dp["broadcast"] = s.buffer_bytes;
    } else {
      dp["all_reduce"] = params * w + (l.allreduce ? 0 : 4 * double(s.tensors));
      double broadcast = s.buffer_bytes;
      if (l.data == DataSharding::kZero1) broadcast += params * w;
      if (broadcast > 0) dp["broadcast"] = broadcast;
    }
  }
  c.bytes = bytes;
  c.stage_bytes.push_back(bytes);

  // Time (Note [planned time] in planner.h), the data dimension's only.
  const double peak = dev.peak_for(job.precision != Precision::kBf16, job.gpus_per_node) *
                      (job.precision == Precision::kFloat64 ? 0.5 : 1.0);
  const double images = double(job.global_batch);
  const double model_flops = s.flops_per_sample * images;
  c.compute_seconds = model_flops / double(job.world()) / (peak * dev.efficiency) +
                      dev.layer_overhead * turns(job) * mb * double(s.layer_numels.size());
  const int64_t n = sharded ? shard_ranks : l.dp;
  const double calls = sharded ? 3.0 * double(units.size()) * mb : std::ceil(params * w / kBucketBytes) + 1;
  const double t_dp = l.dp > 1 ? collective_seconds(job, bytes["dp"], n, l.dp, calls,
                                                    sharded ? fsdp_steps(job, n) : all_reduce_steps(n), sharded)
                               : 0.0;
  const double dp_exposed = exposed_data_seconds(job, t_dp, c.compute_seconds, mb, sharded, calls);
  c.exposed_comm_seconds = dp_exposed;
  c.step_seconds = c.compute_seconds + c.exposed_comm_seconds;
  c.tokens_per_second = images / c.step_seconds;
  c.mfu = std::min(1.0, model_flops / c.step_seconds / (double(job.world()) * peak));
  const double memory = dev.memory_per_node ? dev.memory_bytes / double(job.gpus_per_node) : dev.memory_bytes;
  c.fits = c.memory.total() <= memory * kUsable;
  c.shortfall = c.fits ? 0 : c.memory.total() - memory * kUsable;
  return c;
}

}  // namespace tandem::plan::internal
