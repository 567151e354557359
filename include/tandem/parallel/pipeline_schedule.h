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
//   Interleaved 1F1B (Megatron-LM's virtual pipeline stages): the model is
//          cut into S * V pieces and stage s holds V of them, pieces s,
//          s + S, s + 2S, ... (its chunk c is the model's piece c * S + s).
//          Every stage runs the forwards in the same order, in
//          rounds of S micro-batches, each round through its chunks
//          0 .. V-1 (and the backwards likewise, chunks V-1 .. 0); stage s
//          first runs (S - s - 1) + (V - 1) * S forwards, then alternates.
//          An action is 1/V of a 1F1B action, so the fill and drain shrink
//          by V: when M is a multiple of S the bubble is
//          (S - 1) / (V * M + S - 1); otherwise it lies between that and
//          1F1B's, never above 1F1B's (equal to it at M = 1). In flight on stage s: at
//          most (S - s - 1) + (V - 1) * S + 1 chunk-micro-batches, each about
//          1/V of a stage's activations, so stage 0 holds about as much as
//          under 1F1B. V = 1 is 1F1B.
//
// Dependencies: F(i) on stage s needs F(i) on stage s - 1 (its input); B(i)
// on stage s needs F(i) on stage s and B(i) on stage s + 1 (the gradient of
// its output); with chunks, read "stage s" as the model's piece c * S + s
// and "stage s + 1" as the piece after it (on stage s + 1, or on stage 0
// one chunk on from stage S - 1). simulate() runs a schedule on a unit-time
// clock under those rules, which shows that it cannot deadlock and gives each stage's idle
// share (the bubble; (S - 1) / (M + S - 1) for GPipe and 1F1B when forward
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
  int64_t chunk = 0;  // which of the stage's chunks (interleaved schedules)
  bool operator==(const PipelineAction& o) const {
    return op == o.op && micro_batch == o.micro_batch && chunk == o.chunk;
  }
};

struct PipelineSchedule {
  std::string name;
  int64_t stages = 0, micro_batches = 0;
  std::vector<std::vector<PipelineAction>> actions;  // per stage, in order
  int64_t chunks = 1;  // model chunks per stage (V); the model has stages * chunks pieces
};

PipelineSchedule gpipe_schedule(int64_t stages, int64_t micro_batches);
PipelineSchedule one_f_one_b_schedule(int64_t stages, int64_t micro_batches);
PipelineSchedule interleaved_schedule(int64_t stages, int64_t micro_batches, int64_t chunks);
// "gpipe", "1f1b" (chunks must be 1) or "interleaved"; anything else is a
// tandem::Error naming --schedule (or --virtual-stages).
PipelineSchedule make_pipeline_schedule(const std::string& name, int64_t stages,
                                        int64_t micro_batches, int64_t chunks = 1);

// "F0 F1 B0 B1" for one stage's actions; an action of chunk c > 0 reads
// "F1c2" (micro-batch 1, chunk 2).
std::string describe(const std::vector<PipelineAction>& actions);

struct PipelineSimulation {
  // When each stage ran each of its actions (in its order), in time units
  // of `forward_time` and `backward_time`.
  std::vector<std::vector<double>> start;
  double makespan = 0;
  std::vector<double> idle_share;    // per stage: 1 - busy / makespan
  std::vector<int64_t> max_in_flight;  // per stage: most forwards (of any chunk) not yet backwarded
  // The bubble: idle_share's mean over the stages.
  double mean_idle_share() const;
};

// Checks that every stage runs each F(i) and B(i) of each of its chunks
// exactly once, F(i) before B(i), and that the schedule completes under the dependencies above
// (throws tandem::Error naming the first violation or the deadlock).
PipelineSimulation simulate(const PipelineSchedule& schedule, double forward_time = 1.0,
                            double backward_time = 1.0);

}  // namespace tandem::parallel
