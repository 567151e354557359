// One layout's cost (layout_cost.h; Note [planned traffic]).
#include "tandem/plan/layout_cost.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/dist/device_mesh.h"
#include "tandem/parallel/fsdp_plan.h"
#include "tandem/parallel/pipeline_schedule.h"
#include "tandem/util/check.h"
#include "cost_terms.h"
#include "image_cost.h"

namespace tandem::plan {
namespace {

using internal::kBucketBytes;
using internal::kUsable;
using internal::all_gather_steps;
using internal::all_reduce_steps;
using internal::collective_seconds;
using internal::exposed_data_seconds;
using internal::reduce_scatter_steps;
using internal::replicated_seconds;
using internal::turns;

constexpr double kHeader = 80;              // a pipeline message's header (Note [pipeline messages])

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kReplayedMicroBatches = 1024;  // schedules longer than this use the textbook's figures

double element_bytes(Precision p) { return p == Precision::kFloat64 ? 8 : p == Precision::kFloat32 ? 4 : 2; }
double weight_bytes(Precision p) { return p == Precision::kFloat64 ? 8 : 4; }  // bf16 autocasts float32 weights

// What one pipeline stage holds on one rank of its tp group.
struct Stage {
  int64_t layers = 0;
  bool first = false, last = false;
  double parameters = 0, tensors = 0, whole_parameters = 0;  // whole: not cut by tp
  double layer_experts = 0;  // a layer's experts' parameters on this rank
  std::vector<int64_t> layer_numels;  // the stage's layers in order (embedding, blocks, head), as FSDP sees them
};

Stage stage_of(const ModelShape& m, const Layout& l, int64_t s) {
  Stage st;
  st.first = s == 0;
  st.last = s == l.pp - 1;
  st.layers = m.layers / l.pp + (s < m.layers % l.pp ? 1 : 0);
  const double layer_whole = double(m.layer_parameters - m.layer_cut_parameters);
  // The experts' matrices, cut by tp, of which a rank holds 1 / ep.
  const double experts = double(ceil_div(3 * m.experts * m.expert_ffn * m.hidden, l.tp));
  st.layer_experts = experts / double(l.ep);
  const double layer = double(ceil_div(m.layer_cut_parameters, l.tp)) + layer_whole - experts + st.layer_experts;
  st.parameters = double(st.layers) * layer;
  st.whole_parameters = double(st.layers) * layer_whole;
  st.tensors = double(st.layers * m.layer_tensors);
  const double vocab_rows = double(ceil_div(m.vocab, l.tp)) * double(m.hidden);
  if (st.first) {
    const double positions = double(m.embedding_parameters - m.vocab * m.hidden);
    st.parameters += vocab_rows + positions;
    st.whole_parameters += positions;
    st.tensors += double(m.embedding_tensors);
    st.layer_numels.push_back(static_cast<int64_t>(vocab_rows + positions));
  }
  for (int64_t i = 0; i < st.layers; ++i) st.layer_numels.push_back(static_cast<int64_t>(layer));
  if (st.last) {
    double head = double(m.norm_parameters) + (m.head_parameters > 0 ? vocab_rows : 0);
    if (m.tied && l.pp > 1) head += vocab_rows;  // the head's copy of the embedding
    st.parameters += head;
    st.whole_parameters += double(m.norm_parameters);
    st.tensors += double(m.norm_tensors + m.head_tensors);
    st.layer_numels.push_back(static_cast<int64_t>(head));
  }
  return st;
}

}  // namespace

std::string Layout::mesh() const {
  std::string s;
  auto add = [&s](const std::string& dim, int64_t n) {
    if (n > 1) s += (s.empty() ? "" : ",") + dim + "=" + std::to_string(n);
  };
  add("pp", pp);
  if (data == DataSharding::kHsdp) {
    add("dp_replicate", dp / dp_shard);
    add("dp_shard", dp_shard);
  } else {
    add("dp", dp);
  }
  add("cp", cp);
  add("ep", ep);
  add("tp", tp);
  return s.empty() ? "dp=1" : s;
}

std::string Layout::strategy() const {
  switch (data) {
    case DataSharding::kDdp: return allreduce ? "allreduce" : "ddp";
    case DataSharding::kZero1: return "zero1";
    case DataSharding::kFsdp: return "fsdp";
    case DataSharding::kHsdp: return "hsdp";
  }
  return "";
}

LayoutCost layout_cost(const Job& job, const Layout& l) {
  if (job.model.image) return internal::image_layout_cost(job, l);
  const auto& m = job.model;
  const auto& dev = job.device;
  TANDEM_CHECK(l.dp * l.pp * l.cp * l.tp == job.world(), "layout ", l.mesh(), " does not lay out ", job.world(),
               " ranks");
  TANDEM_CHECK(l.ep == 1 || (m.experts % l.ep == 0 && (l.dp * l.cp) % l.ep == 0 && l.data == DataSharding::kDdp),
               "layout ", l.mesh(), ": ep=", l.ep, " must divide the ", m.experts, " experts and the ", l.dp * l.cp,
               " data ranks, under DDP");
  TANDEM_CHECK(job.seq_len % (2 * l.cp) == 0, "layout ", l.mesh(), ": cp=", l.cp, " cuts a sequence into ", 2 * l.cp,
               " chunks, which ", job.seq_len, " tokens are not");
  TANDEM_CHECK(l.micro_batch * l.micro_batches * l.dp == job.global_batch, "layout ", l.mesh(), ": ", l.micro_batches,
               " micro-batches of ", l.micro_batch, " on ", l.dp, " dp ranks are not the global batch of ",
               job.global_batch);
  TANDEM_CHECK(l.pp <= m.layers, "layout ", l.mesh(), ": more stages than ", m.layers, " layers");
  LayoutCost c;
  c.layout = l;
  const double e = element_bytes(job.precision), w = weight_bytes(job.precision);
  const double tokens = double(l.micro_batch * job.seq_len / l.cp);  // a micro-batch's, on this rank
  const double d = double(m.hidden);
  const int64_t mb = l.micro_batches;
  const bool sharded = l.data == DataSharding::kFsdp || l.data == DataSharding::kHsdp;
  const int64_t data_ranks = l.dp * l.cp;  // the data dimension's: they reduce the gradients together
  const int64_t shard_ranks = (l.data == DataSharding::kHsdp ? l.dp_shard : l.dp) * l.cp;

  // The schedule, replayed: its idle share and each stage's forwards in flight.
  parallel::PipelineSimulation sim;
  if (l.pp > 1 && mb <= kReplayedMicroBatches) {
    const double backward = l.recompute ? 3.0 : 2.0;  // backward's products twice forward's (and recomputed)
    sim = parallel::simulate(parallel::make_pipeline_schedule(l.schedule, l.pp, mb), 1.0, backward);
    c.bubble = sim.mean_idle_share();
  } else if (l.pp > 1) {
    // Past kReplayedMicroBatches the textbook's figures, which the replay
    // equals for GPipe and 1F1B (PlannerTest): (p - 1) / (m + p - 1), and
    // in flight m (GPipe) or p - s (1F1B's stage s).
    c.bubble = double(l.pp - 1) / double(mb + l.pp - 1);
    for (int64_t s = 0; s < l.pp; ++s) sim.max_in_flight.push_back(l.schedule == "gpipe" ? mb : l.pp - s);
  }

  double gathers = 0, scatters = 0;  // FSDP's calls a step, the most of a stage's
  for (int64_t s = 0; s < l.pp; ++s) {
    const Stage st = stage_of(m, l, s);
    Memory mem;
    mem.parameters = st.parameters * w;
    mem.gradients = st.parameters * w;
    const double states = job.optimizer == OptimizerKind::kAdamW ? 2 : job.optimizer == OptimizerKind::kSgdMomentum ? 1 : 0;
    mem.optimizer = states * st.parameters * w;  // AdamW's two moments, SGD's momentum
    if (sharded) {
      mem.parameters /= double(shard_ranks);
      mem.gradients /= double(shard_ranks);
      mem.optimizer /= double(shard_ranks);
      // Two units (layers) whole at once, with their gradients (prefetch).
      const double unit = st.layers > 0 ? st.parameters / double(std::max<int64_t>(st.layers, 1)) : st.parameters;
      mem.buffers = 2 * 2 * unit * w;
    } else if (l.data == DataSharding::kZero1) {
      mem.optimizer /= double(data_ranks);
    }
    // DDP's flat buckets hold the gradients themselves (Note [gradients are
    // bucket views] in engine/ddp_plan.cpp): no memory of their own. Under
    // ep the experts' gradients are not DDP's (Note [expert gradients]).
    const double stage_experts = l.ep > 1 ? double(st.layers) * st.layer_experts : 0.0;
    const double in_flight = l.pp > 1 ? double(sim.max_in_flight[static_cast<size_t>(s)]) : 1.0;
    const double whole = m.activations_norms_per_token() / double(l.sequence_parallel ? l.tp : 1) +
                         m.activations_region_inputs_per_token();
    const double layer = tokens * e * (whole + m.activations_inside_per_token() / double(l.tp));
    const double kept = l.recompute ? tokens * e * d / double(l.sequence_parallel ? l.tp : 1) : layer;
    mem.activations = double(st.layers) * kept * in_flight + (l.recompute ? layer : 0);
    // Note [dispatch memory]: under ep a mixture layer's peak holds two
    // more rows a (token, expert) pair of the rank than the layer alone:
    // fitted to the runs, not counted tensor by tensor (the dispatch's
    // own rows, sent, arrived, by expert and back, live only inside it).
    // mixtral-tiny at dp=2,ep=2 held 4.2 MB more than its layers without
    // ep, 2 x 1,024 pairs x 128 x 4 bytes a layer over 4 layers, trained
    // with the plan's SGD (the fit had said four while the runs' AdamW
    // state went unplanned).
    if (l.ep > 1) {
      mem.activations += double(st.layers) * in_flight * 2.0 * tokens * double(m.experts_per_token) * d * e;
    }
    if (dev.cores > 0) {
      // Note [cpu layouts]: on CPUs GPT-2's Conv1D multiplies by a
      // contiguous transpose of its weight, which backward keeps (a copy
      // of a block's matrices a micro-batch in flight); and a pipeline
      // rank keeps the other stages' weights (for the gathers of
      // checkpoints and exports; on CUDA they wait in host memory).
      if (!m.llama) mem.activations += double(st.layers) * in_flight * 12.0 * d * d / double(l.tp) * w;
      if (l.pp > 1) {
        for (int64_t other = 0; other < l.pp; ++other) {
          if (other != s) mem.parameters += stage_of(m, l, other).parameters * w;
        }
      }
    }
    if (st.last) mem.activations += tokens * double(ceil_div(m.vocab, l.tp)) * (e + 4);  // logits, float32 softmax
    // A pipeline keeps every message it sent until the step's end, when it
    // waits for them all (Note [pipeline sends] in distributed_pipeline.cpp):
    // each micro-batch's activation forward and gradient backward.
    if (l.pp > 1) {
      const double sends = (st.last ? 0.0 : 1.0) + (st.first ? 0.0 : 1.0);
      mem.buffers += double(mb) * sends * (kHeader + tokens * d * e);
    }
    if (mem.total() > c.memory.total()) c.memory = mem;
    c.stage_memory.push_back(mem);

    // Traffic of this stage's ranks (Note [planned traffic]); the most of each kept.
    std::map<std::string, std::map<std::string, double>> bytes;
    if (data_ranks > 1) {
      auto& dp = bytes[dist::data_group_name(l.cp)];
      if (sharded) {
        // Units as FSDP plans them (parallel::plan_units); with ZeRO-3 each
        // gathered twice but the last, kept from forward to its backward.
        const double grads = st.parameters * w, shard = grads / double(shard_ranks);
        const auto units = parallel::plan_units(st.layer_numels, l.fsdp_min_unit);
        const double last = units.empty() ? 0 : double(units.back().numel) * w / double(shard_ranks);
        // A tied embedding's unit is pinned (Note [fsdp tied weights]):
        // gathered once, at the start of forward.
        const double first = units.empty() ? 0 : double(units.front().numel) * w / double(shard_ranks);
        const double pinned = m.tied && l.pp == 1 && units.size() > 1 ? first : 0;
        const double times = l.pp > 1 ? 1.0 : double(mb);  // a stage gathers once a step (Note [fsdp under a pipeline])
        // Its calls: a gather a unit, again in backward but the last's
        // (and a pinned one's) under ZeRO-3; a reduce-scatter a unit.
        const double u = double(units.size());
        gathers = std::max(gathers, times * (l.pp == 1 && l.fsdp_reshard ? 2 * u - 1 - (pinned > 0 ? 1 : 0) : u));
        scatters = std::max(scatters, times * u);
        dp["all_gather"] = times * (l.pp == 1 && l.fsdp_reshard ? 2 * shard - last - pinned : shard);
        dp["reduce_scatter"] = times * grads;
        if (l.data == DataSharding::kHsdp && data_ranks > shard_ranks) dp["all_reduce"] = times * shard;
      } else {
        // Under ep the experts' three matrices a layer are not DDP's.
        const double tensors = st.tensors - (l.ep > 1 ? 3.0 * double(st.layers) : 0.0);
        dp["all_reduce"] = (st.parameters - stage_experts) * w + (l.allreduce ? 0 : 4 * tensors);
        if (l.data == DataSharding::kZero1) dp["broadcast"] = st.parameters * w;
      }
    }
    if (l.ep > 1) {
      // A uniform routing: of a rank's k pairs a token, (ep - 1) / ep away.
      const double away = tokens * double(m.experts_per_token) * double(l.ep - 1) / double(l.ep);
      const double counts = 8.0 * double(m.experts - m.experts / l.ep);
      bytes["ep"]["all_to_all"] = double(mb) * double(st.layers) * (4.0 * away * d * e + counts);
      if (data_ranks > l.ep) bytes["ep_replicate"]["all_reduce"] = stage_experts * w;
    }
    if (l.tp > 1) {
      auto& tp = bytes["tp"];
      const double ends = (st.first ? 1.0 : 0.0) + (st.last ? 1.0 : 0.0);
      const double regions = 4.0 * double(st.layers) + ends + (l.recompute ? 2.0 * double(st.layers) : 0.0);
      const double loss = st.last ? 4.0 * tokens * e : 0.0;
      if (l.sequence_parallel) {
        tp["all_gather"] = double(mb) * regions * tokens * d * e / double(l.tp);
        tp["reduce_scatter"] = double(mb) * regions * tokens * d * e;
        tp["all_reduce"] = double(mb) * loss + st.whole_parameters * w;
      } else {
        // A router's and q/k norms' partial gradients summed over tp too.
        tp["all_reduce"] = double(mb) * (regions * tokens * d * e + loss) +
                           double(st.layers * m.layer_partial_parameters) * w;
      }
    }
    if (l.cp > 1) {
      // A block: the rank's tokens of its tp share of the key/value heads.
      const double block = tokens * double(m.kv_heads / l.tp) * double(m.head_dim) * e;
      const double blocks = 6.0 * double(l.cp - 1) + 2.0 + (l.recompute ? 2.0 * double(l.cp - 1) : 0.0);
      auto& cp = bytes["cp"];
      cp["send"] = cp["recv"] = double(mb) * double(st.layers) * blocks * block;
    }
    if (l.pp > 1) {
      auto& pp = bytes["pp"];
      const double boundaries = (st.first || st.last) ? 1.0 : 2.0;
      pp["send"] = pp["recv"] = double(mb) * boundaries * (kHeader + tokens * d * e);
      pp["broadcast"] = 8;  // the loss, from the last stage
    }
    for (const auto& [dim, by] : bytes) {
      for (const auto& [collective, b] : by) c.bytes[dim][collective] = std::max(c.bytes[dim][collective], b);
    }
    c.stage_bytes.push_back(std::move(bytes));
  }

  // Time (Note [planned time] in planner.h).
  const double peak = dev.peak_for(job.precision != Precision::kBf16, job.gpus_per_node) *
                      (job.precision == Precision::kFloat64 ? 0.5 : 1.0);
  const double step_tokens = double(job.global_batch * job.seq_len);
  const double model_flops = m.flops_per_token(job.seq_len) * step_tokens;
  const double rank_flops = model_flops / double(job.world()) * (l.recompute ? 4.0 / 3.0 : 1.0);
  c.compute_seconds = rank_flops / (peak * dev.efficiency);
  // What the rank's layers cost besides their FLOPs, each micro-batch's
  // (Note [calibrated profile]); taking turns where ranks outnumber cores
  // (Note [ranks that take turns] in cost_terms.h).
  const int64_t layers_here = ceil_div(m.layers, l.pp);
  c.compute_seconds +=
      dev.layer_overhead * turns(job) * double(mb) * double(layers_here) * (l.recompute ? 4.0 / 3.0 : 1.0);
  // The norms and residual adds every rank of a tp group runs whole (or
  // its part of the sequence under sequence parallelism).
  c.compute_seconds += replicated_seconds(job, double(mb * layers_here) * (l.recompute ? 4.0 / 3.0 : 1.0),
                                          tokens * d / double(l.sequence_parallel ? l.tp : 1), e);
  // A dimension's collectives, `calls` of `steps` ring steps; or only
  // those of it named.
  auto seconds = [&](const std::string& dim, int64_t n, int64_t span, double calls, double steps) {
    auto found = c.bytes.find(dim);
    return found == c.bytes.end() ? 0.0 : collective_seconds(job, found->second, n, span, calls, steps);
  };
  auto seconds_of = [&](const std::string& dim, const std::vector<std::string>& names, int64_t n, int64_t span,
                        double calls, double steps, bool prefetched) {
    std::map<std::string, double> some;
    auto found = c.bytes.find(dim);
    for (const auto& name : names) {
      if (found != c.bytes.end() && found->second.count(name)) some[name] = found->second.at(name);
    }
    return collective_seconds(job, some, n, span, calls, steps, prefetched);
  };
  // Each ring step pays the link's latency (all_reduce_steps and its
  // kin): sequence parallelism's two calls a region cost more than one
  // all-reduce on few ranks. A send is one step.
  const double regions = double(mb) * (4.0 * double(layers_here) + 4.0);
  const double t_tp =
      l.sequence_parallel
          ? seconds("tp", l.tp, l.tp, 2.0 * regions, (all_gather_steps(l.tp) + reduce_scatter_steps(job, l.tp)) / 2)
          : seconds("tp", l.tp, l.tp, regions, all_reduce_steps(l.tp));
  const double t_pp = seconds("pp", 2, job.world(), double(2 * mb + 1), 1.0);
  // The ring's hops, a layer and micro-batch: C - 1 forward (again when
  // recomputed), C backward; each waited on before the block it brings.
  const double hops = double(l.cp - 1) * (l.recompute ? 2.0 : 1.0) + double(l.cp);
  const double t_cp = seconds("cp", l.cp, l.cp * l.tp, double(mb) * double(layers_here) * hops, 1.0);
  const int64_t dp_ranks = sharded ? shard_ranks : data_ranks;
  // ep's all-to-alls (the counts, the rows there and back, each way), and
  // the experts' gradients summed over ep_replicate after backward.
  const int64_t replicas = data_ranks / l.ep;
  const double t_ep = seconds("ep", l.ep, l.ep * l.tp, double(mb) * double(layers_here) * 6.0, double(l.ep - 1)) +
                      seconds("ep_replicate", replicas, data_ranks * l.tp, 1.0, 2.0 * double(replicas - 1));
  // The data dimension's: DDP's buckets, all-reduced; FSDP's gathers and
  // reduce-scatters, each at its ring's steps (HSDP's all-reduce of the
  // shards across replicas, once a step, counted with the scatters), all
  // prefetched (Note [prefetched calls that take turns] in cost_terms.h).
  const std::string data = dist::data_group_name(l.cp);
  const double dp_calls = sharded ? gathers + scatters : std::ceil(c.memory.gradients / kBucketBytes) + 1;
  const double t_dp =
      sharded ? seconds_of(data, {"all_gather"}, dp_ranks, data_ranks * l.tp, gathers, all_gather_steps(dp_ranks),
                           true) +
                    seconds_of(data, {"reduce_scatter", "all_reduce"}, dp_ranks, data_ranks * l.tp, scatters,
                               reduce_scatter_steps(job, dp_ranks), true)
              : seconds(data, dp_ranks, data_ranks * l.tp, dp_calls, all_reduce_steps(dp_ranks));
  // tp's all-reduces sit between the layers' products and a pipeline's
  // sends on the critical path; of dp's, what its overlap leaves.
  const double dp_exposed = exposed_data_seconds(job, t_dp, c.compute_seconds, mb, sharded, dp_calls);
  c.exposed_comm_seconds = t_tp + t_cp + t_ep + t_pp + dp_exposed;
  // Note [bubbles that other ranks fill]: a pipeline's stage idles for the
  // bubble's share of the step, unless ranks outnumber cores: then its
  // core goes to the busy ranks meanwhile, which run faster, and the step
  // is the larger of the critical path at a core a rank (the busy time
  // over 1 - bubble, the time taking no turns) and all ranks' work over
  // the cores (the busy time, taking turns).
  const double busy = c.compute_seconds + c.exposed_comm_seconds;
  c.step_seconds = busy * std::max(1.0, 1.0 / (turns(job) * (1.0 - c.bubble)));
  c.bubble_seconds = c.step_seconds - busy;
  c.tokens_per_second = step_tokens / c.step_seconds;
  c.mfu = std::min(1.0, model_flops / c.step_seconds / (double(job.world()) * peak));  // 1 at most, to rounding

  const double memory = dev.memory_per_node ? dev.memory_bytes / double(job.gpus_per_node) : dev.memory_bytes;
  c.fits = c.memory.total() <= memory * kUsable;
  c.shortfall = c.fits ? 0 : c.memory.total() - memory * kUsable;
  return c;
}

}  // namespace tandem::plan
