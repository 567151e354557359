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

PipelineAction F(int64_t i) { return {PipelineOp::kForward, i}; }
PipelineAction B(int64_t i) { return {PipelineOp::kBackward, i}; }

std::string name_of(const PipelineAction& a) {
  return (a.op == PipelineOp::kForward ? "F" : "B") + std::to_string(a.micro_batch);
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

PipelineSchedule make_pipeline_schedule(const std::string& name, int64_t stages,
                                        int64_t micro_batches) {
  if (name == "gpipe") return gpipe_schedule(stages, micro_batches);
  if (name == "1f1b") return one_f_one_b_schedule(stages, micro_batches);
  TANDEM_FAIL("--schedule: expected gpipe or 1f1b, got '", name, "'");
}

std::string describe(const std::vector<PipelineAction>& actions) {
  std::string out;
  for (const auto& a : actions) out += (out.empty() ? "" : " ") + name_of(a);
  return out;
}

PipelineSimulation simulate(const PipelineSchedule& schedule, double forward_time,
                            double backward_time) {
  const int64_t S = schedule.stages, M = schedule.micro_batches;
  TANDEM_CHECK(static_cast<int64_t>(schedule.actions.size()) == S, schedule.name, ": ",
               schedule.actions.size(), " action lists for ", S, " stages");
  // Each stage: every F(i) and B(i) once, F(i) before B(i).
  for (int64_t s = 0; s < S; ++s) {
    std::vector<int> forward_at(M, -1), backward_at(M, -1);
    const auto& actions = schedule.actions[s];
    for (size_t k = 0; k < actions.size(); ++k) {
      const auto& a = actions[k];
      TANDEM_CHECK(a.micro_batch >= 0 && a.micro_batch < M, schedule.name, ": stage ", s, " has ",
                   name_of(a), " but there are ", M, " micro-batches");
      auto& at = a.op == PipelineOp::kForward ? forward_at : backward_at;
      TANDEM_CHECK(at[a.micro_batch] < 0, schedule.name, ": stage ", s, " runs ", name_of(a), " twice");
      at[a.micro_batch] = static_cast<int>(k);
    }
    for (int64_t i = 0; i < M; ++i) {
      TANDEM_CHECK(forward_at[i] >= 0 && backward_at[i] >= 0, schedule.name, ": stage ", s,
                   " never runs ", forward_at[i] < 0 ? "F" : "B", i);
      TANDEM_CHECK(forward_at[i] < backward_at[i], schedule.name, ": stage ", s, " runs B", i,
                   " before F", i);
    }
  }
  // Unit-clock simulation: an action starts when its stage is free and its
  // dependencies have finished.
  constexpr double kPending = -1;
  std::vector<std::vector<double>> f_end(S, std::vector<double>(M, kPending));
  std::vector<std::vector<double>> b_end(S, std::vector<double>(M, kPending));
  PipelineSimulation out;
  out.start.assign(S, {});
  std::vector<size_t> next(S, 0);
  std::vector<double> free_at(S, 0), busy(S, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int64_t s = 0; s < S; ++s) {
      while (next[s] < schedule.actions[s].size()) {
        const auto& a = schedule.actions[s][next[s]];
        const int64_t i = a.micro_batch;
        double ready = free_at[s];
        if (a.op == PipelineOp::kForward) {
          if (s > 0) {
            if (f_end[s - 1][i] == kPending) break;
            ready = std::max(ready, f_end[s - 1][i]);
          }
        } else {
          if (s + 1 < S) {
            if (b_end[s + 1][i] == kPending) break;
            ready = std::max(ready, b_end[s + 1][i]);
          }
        }
        double length = a.op == PipelineOp::kForward ? forward_time : backward_time;
        out.start[s].push_back(ready);
        (a.op == PipelineOp::kForward ? f_end : b_end)[s][i] = ready + length;
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
