// tandem/parallel/pipeline_schedule.h: pipeline schedules as plain data.
//
// A pipeline splits a model into S stages (one per device) and a batch into
// M micro-batches. A schedule says, for each stage, the order of its
// actions: F(i), the forward of micro-batch i, and B(i), its backward.
// Keeping schedules as data lets them be checked without any device:
//
//   GPipe: every stage runs F(0) .. F(M-1), then B(0) .. B(M-1): simple, but
//          each stage holds all M micro-batches' activations at once.
//   1F1B:  stage s first runs min(S - s - 1, M) forwards (warm-up), then
//          alternates one forward and one backward, then finishes the
//          backwards (PipeDream-flush): at most S - s micro-batches in flight
//          on stage s, the same bubble as GPipe.
//
// Dependencies: F(i) on stage s needs F(i) on stage s - 1 (its input); B(i)
// on stage s needs F(i) on stage s and B(i) on stage s + 1 (the gradient of
// its output). simulate() runs a schedule on a unit-time clock under those
// rules, which shows that it cannot deadlock and gives each stage's idle
// share (the bubble; (S - 1) / (M + S - 1) for both schedules when forward
// and backward take the same time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::parallel {

enum class PipelineOp { kForward, kBackward };

struct PipelineAction {
  PipelineOp op;
  int64_t micro_batch;
  bool operator==(const PipelineAction& o) const { return op == o.op && micro_batch == o.micro_batch; }
};

struct PipelineSchedule {
  std::string name;
  int64_t stages = 0, micro_batches = 0;
  std::vector<std::vector<PipelineAction>> actions;  // per stage, in order
};

PipelineSchedule gpipe_schedule(int64_t stages, int64_t micro_batches);
PipelineSchedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches);
// "gpipe" or "1f1b"; anything else is a tandem::Error naming --schedule.
PipelineSchedule make_pipeline_schedule(const std::string& name, int64_t stages,
                                        int64_t micro_batches);

// "F0 F1 B0 B1" for one stage's actions.
std::string describe(const std::vector<PipelineAction>& actions);

struct PipelineSimulation {
  // When each stage ran each of its actions (in its order), in time units
  // of `forward_time` and `backward_time`.
  std::vector<std::vector<double>> start;
  double makespan = 0;
  std::vector<double> idle_share;    // per stage: 1 - busy / makespan
  std::vector<int64_t> max_in_flight;  // per stage: most forwards not yet backwarded
};

// Checks that every stage runs each F(i) and B(i) exactly once, F(i) before
// B(i), and that the schedule completes under the dependencies above
// (throws tandem::Error naming the first violation or the deadlock).
PipelineSimulation simulate(const PipelineSchedule& schedule, double forward_time = 1.0,
                            double backward_time = 1.0);

}  // namespace tandem::parallel
