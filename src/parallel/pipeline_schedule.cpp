#include "tandem/parallel/pipeline_schedule.h"

#include <algorithm>
#include <sstream>

#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

void check_sizes(int64_t stages, int64_t micro_batches) {
  TANDEM_CHECK(stages >= 1, "pipeline: expected at least one stage, got ", stages);
  TANDEM_CHECK(micro_batches >= 1, "--micro-batches: expected at least 1, got ", micro_batches);
}

PipelineAction F(int64_t i, int64_t chunk = 0) { return {PipelineOp::kForward, i, chunk}; }
PipelineAction B(int64_t i, int64_t chunk = 0) { return {PipelineOp::kBackward, i, chunk}; }

std::string name_of(const PipelineAction& a) {
  return (a.op == PipelineOp::kForward ? "F" : "B") + std::to_string(a.micro_batch) +
         (a.chunk != 0 ? "c" + std::to_string(a.chunk) : "");
}

// Interleaved 1F1B's order of (chunk, micro-batch) pairs, the same on every
// stage: rounds of `stages` micro-batches (the last may be shorter), each
// round through the chunks in turn, ascending for the forwards and
// descending for the backwards.
std::vector<PipelineAction> interleaved_order(PipelineOp op, int64_t stages, int64_t micro_batches,
                                              int64_t chunks) {
  std::vector<PipelineAction> order;
  for (int64_t first = 0; first < micro_batches; first += stages) {
    const int64_t round = std::min(stages, micro_batches - first);
    for (int64_t k = 0; k < chunks; ++k) {
      const int64_t chunk = op == PipelineOp::kForward ? k : chunks - 1 - k;
      for (int64_t j = 0; j < round; ++j) order.push_back({op, first + j, chunk});
    }
  }
  return order;
}

}  // namespace

PipelineSchedule gpipe_schedule(int64_t stages, int64_t micro_batches) {
  check_sizes(stages, micro_batches);
  PipelineSchedule s{"gpipe", stages, micro_batches, {}};
  for (int64_t stage = 0; stage < stages; ++stage) {
    std::vector<PipelineAction> actions;
    for (int64_t i = 0; i < micro_batches; ++i) actions.push_back(F(i));
    for (int64_t i = 0; i < micro_batches; ++i) actions.push_back(B(i));
    s.actions.push_back(std::move(actions));
  }
  return s;
}

PipelineSchedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches) {
  check_sizes(stages, micro_batches);
  PipelineSchedule s{"1f1b", stages, micro_batches, {}};
  for (int64_t stage = 0; stage < stages; ++stage) {
    const int64_t warmup = std::min(stages - stage - 1, micro_batches);
    std::vector<PipelineAction> actions;
    for (int64_t i = 0; i < warmup; ++i) actions.push_back(F(i));
    for (int64_t k = 0; k < micro_batches - warmup; ++k) {
      actions.push_back(F(warmup + k));
      actions.push_back(B(k));
    }
    for (int64_t i = micro_batches - warmup; i < micro_batches; ++i) actions.push_back(B(i));
    s.actions.push_back(std::move(actions));
  }
  return s;
}

PipelineSchedule interleaved_schedule(int64_t stages, int64_t micro_batches, int64_t chunks) {
  check_sizes(stages, micro_batches);
  TANDEM_CHECK(chunks >= 1, "--virtual-stages: expected at least 1, got ", chunks);
  PipelineSchedule s{"interleaved", stages, micro_batches, {}, chunks};
  const auto forwards = interleaved_order(PipelineOp::kForward, stages, micro_batches, chunks);
  const auto backwards = interleaved_order(PipelineOp::kBackward, stages, micro_batches, chunks);
  const auto total = static_cast<int64_t>(forwards.size());
  for (int64_t stage = 0; stage < stages; ++stage) {
    // Megatron-LM warms up with 2 (S - s - 1) + (V - 1) S forwards, which
    // deadlocks unless M is a multiple of S; this count does not (checked
    // by simulation for S <= 6, V <= 4, M <= 20) and holds fewer in flight.
    const int64_t warmup = std::min((stages - stage - 1) + (chunks - 1) * stages, total);
    std::vector<PipelineAction> actions(forwards.begin(), forwards.begin() + warmup);
    for (int64_t k = 0; k < total - warmup; ++k) {
      actions.push_back(forwards[warmup + k]);
      actions.push_back(backwards[k]);
    }
    actions.insert(actions.end(), backwards.begin() + (total - warmup), backwards.end());
    s.actions.push_back(std::move(actions));
  }
  return s;
}

PipelineSchedule make_pipeline_schedule(const std::string& name, int64_t stages,
                                        int64_t micro_batches, int64_t chunks) {
  if (name == "interleaved") return interleaved_schedule(stages, micro_batches, chunks);
  if (name != "gpipe" && name != "1f1b") {
    TANDEM_FAIL("--schedule: expected gpipe, 1f1b or interleaved, got '", name, "'");
  }
  TANDEM_CHECK(chunks == 1, "--virtual-stages ", chunks,
               ": more than one chunk per stage needs --schedule interleaved, not ", name);
  return name == "gpipe" ? gpipe_schedule(stages, micro_batches)
                         : one_f_one_b_schedule(stages, micro_batches);
}

std::string describe(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const auto& a : actions) out += (out.empty() ? "" : " ") + name_of(a);
  return out;
}

double PipelineSimulation::mean_idle_share() const {
  double sum = 0;
  for (double share : idle_share) sum += share;
  return idle_share.empty() ? 0.0 : sum / static_cast<double>(idle_share.size());
}

PipelineSimulation simulate(const PipelineSchedule& schedule, double forward_time,
                            double backward_time) {
  const int64_t S = schedule.stages, M = schedule.micro_batches, V = schedule.chunks;
  TANDEM_CHECK(V >= 1, schedule.name, ": ", V, " chunks per stage");
  TANDEM_CHECK(static_cast<int64_t>(schedule.actions.size()) == S, schedule.name, ": ",
               schedule.actions.size(), " action lists for ", S, " stages");
  // Each stage: every F(i) and B(i) of each chunk once, F(i) before B(i).
  // Slot c * M + i is micro-batch i of chunk c.
  for (int64_t s = 0; s < S; ++s) {
    std::vector<int> forward_at(V * M, -1), backward_at(V * M, -1);
    const auto& actions = schedule.actions[s];
    for (size_t k = 0; k < actions.size(); ++k) {
      const auto& a = actions[k];
      TANDEM_CHECK(a.micro_batch >= 0 && a.micro_batch < M, schedule.name, ": stage ", s, " has ",
                   name_of(a), " but there are ", M, " micro-batches");
      TANDEM_CHECK(a.chunk >= 0 && a.chunk < V, schedule.name, ": stage ", s, " has ",
                   name_of(a), " but there are ", V, " chunks per stage");
      auto& at = a.op == PipelineOp::kForward ? forward_at : backward_at;
      TANDEM_CHECK(at[a.chunk * M + a.micro_batch] < 0, schedule.name, ": stage ", s, " runs ",
                   name_of(a), " twice");
      at[a.chunk * M + a.micro_batch] = static_cast<int>(k);
    }
    for (int64_t c = 0; c < V; ++c) {
      for (int64_t i = 0; i < M; ++i) {
        const auto slot = c * M + i;
        const PipelineAction missing{forward_at[slot] < 0 ? PipelineOp::kForward : PipelineOp::kBackward, i, c};
        TANDEM_CHECK(forward_at[slot] >= 0 && backward_at[slot] >= 0, schedule.name, ": stage ", s,
                     " never runs ", name_of(missing));
        TANDEM_CHECK(forward_at[slot] < backward_at[slot], schedule.name, ": stage ", s, " runs ",
                     name_of(B(i, c)), " before ", name_of(F(i, c)));
      }
    }
  }
  // Unit-clock simulation: an action starts when its stage is free and its
  // dependencies have finished. Piece p = c * S + s of the model is chunk c
  // of stage s.
  const int64_t P = S * V;
  constexpr double kPending = -1;
  std::vector<std::vector<double>> f_end(P, std::vector<double>(M, kPending));
  std::vector<std::vector<double>> b_end(P, std::vector<double>(M, kPending));
  PipelineSimulation out;
  out.start.assign(S, {});
  std::vector<size_t> next(S, 0);
  std::vector<double> free_at(S, 0), busy(S, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < S; ++s) {
      while (next[s] < schedule.actions[s].size()) {
        const auto& a = schedule.actions[s][next[s]];
        const int64_t i = a.micro_batch, piece = a.chunk * S + s;
        double ready = free_at[s];
        if (a.op == PipelineOp::kForward) {
          if (piece > 0) {
            if (f_end[piece - 1][i] == kPending) break;
            ready = std::max(ready, f_end[piece - 1][i]);
          }
        } else {
          if (piece + 1 < P) {
            if (b_end[piece + 1][i] == kPending) break;
            ready = std::max(ready, b_end[piece + 1][i]);
          }
        }
        double length = a.op == PipelineOp::kForward ? forward_time : backward_time;
        out.start[s].push_back(ready);
        (a.op == PipelineOp::kForward ? f_end : b_end)[piece][i] = ready + length;
        free_at[s] = ready + length;
        busy[s] += length;
        ++next[s];
        progress = true;
      }
    }
  }
  for (int64_t s = 0; s < S; ++s) {
    TANDEM_CHECK(next[s] == schedule.actions[s].size(), schedule.name, ": deadlock: stage ", s,
                 " waits forever at ", name_of(schedule.actions[s][next[s]]));
    out.makespan = std::max(out.makespan, free_at[s]);
  }
  for (int64_t s = 0; s < S; ++s) {
    out.idle_share.push_back(out.makespan > 0 ? 1 - busy[s] / out.makespan : 0);
    int64_t in_flight = 0, most = 0;
    for (const auto& a : schedule.actions[s]) {
      in_flight += a.op == PipelineOp::kForward ? 1 : -1;
      most = std::max(most, in_flight);
    }
    out.max_in_flight.push_back(most);
  }
  return out;
}

}  // namespace tandem::parallel
