// Pipeline schedules as data: order, dependencies, micro-batches in flight
// and the bubble, with no device involved.
#include <gtest/gtest.h>

#include "tandem/parallel/pipeline_schedule.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace {

TEST(PipelineScheduleTest, GpipeRunsAllForwardsThenAllBackwards) {
  auto s = gpipe_schedule(2, 3);
  ASSERT_EQ(s.actions.size(), 2u);
  for (const auto& stage : s.actions) EXPECT_EQ(describe(stage), "F0 F1 F2 B0 B1 B2");
}

TEST(PipelineScheduleTest, OneFOneBWarmsUpThenAlternates) {
  auto s = one_f_one_b_schedule(4, 6);
  EXPECT_EQ(describe(s.actions[0]), "F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5");
  EXPECT_EQ(describe(s.actions[1]), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5");
  EXPECT_EQ(describe(s.actions[2]), "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5");
  EXPECT_EQ(describe(s.actions[3]), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5");
  // Fewer micro-batches than stages: the warm-up is cut short.
  EXPECT_EQ(describe(one_f_one_b_schedule(4, 2).actions[0]), "F0 F1 B0 B1");
}

// 1F1B never holds more than S - s micro-batches on stage s (so never more
// than the number of stages); GPipe holds all M.
TEST(PipelineScheduleTest, MicroBatchesInFlight) {
  for (int64_t stages : {1, 2, 3, 4, 8}) {
    for (int64_t m : {1, 2, 4, 8, 16}) {
      auto one = simulate(one_f_one_b_schedule(stages, m));
      auto all = simulate(gpipe_schedule(stages, m));
      for (int64_t s = 0; s < stages; ++s) {
        EXPECT_EQ(one.max_in_flight[s], std::min(stages - s, m)) << stages << " stages, " << m << " micro-batches, stage " << s;
        EXPECT_LE(one.max_in_flight[s], stages);
        EXPECT_EQ(all.max_in_flight[s], m);
      }
    }
  }
}

// With forward and backward of equal length, both schedules have the
// textbook bubble (S - 1) / (M + S - 1) on every stage.
TEST(PipelineScheduleTest, BubbleIsTheTextbookOne) {
  for (int64_t stages : {2, 4}) {
    for (int64_t m : {1, 2, 4, 8}) {
      double want = double(stages - 1) / double(m + stages - 1);
      for (const auto& schedule : {gpipe_schedule(stages, m), one_f_one_b_schedule(stages, m)}) {
        auto sim = simulate(schedule);
        EXPECT_DOUBLE_EQ(sim.makespan, 2.0 * (m + stages - 1)) << schedule.name;
        for (double idle : sim.idle_share) EXPECT_NEAR(idle, want, 1e-12) << schedule.name;
        EXPECT_NEAR(sim.mean_idle_share(), want, 1e-12) << schedule.name;
      }
    }
  }
}

// The simulation respects the dependencies: F(i) on stage s starts after it
// ended on stage s - 1; B(i) after it ended on stage s + 1.
TEST(PipelineScheduleTest, SimulationRespectsDependencies) {
  auto schedule = one_f_one_b_schedule(3, 5);
  auto sim = simulate(schedule, 1.0, 2.0);
  std::vector<std::vector<double>> f(3, std::vector<double>(5)), b(3, std::vector<double>(5));
  for (int s = 0; s < 3; ++s) {
    for (size_t k = 0; k < schedule.actions[s].size(); ++k) {
      const auto& a = schedule.actions[s][k];
      (a.op == PipelineOp::kForward ? f : b)[s][a.micro_batch] = sim.start[s][k];
    }
  }
  for (int s = 0; s < 3; ++s) {
    for (int i = 0; i < 5; ++i) {
      if (s > 0) EXPECT_GE(f[s][i], f[s - 1][i] + 1.0);
      if (s < 2) EXPECT_GE(b[s][i], b[s + 1][i] + 2.0);
      EXPECT_GE(b[s][i], f[s][i] + 1.0);
    }
  }
}

TEST(PipelineScheduleTest, InterleavedRunsRoundsThroughTheChunks) {
  auto s = interleaved_schedule(2, 4, 2);
  ASSERT_EQ(s.actions.size(), 2u);
  EXPECT_EQ(s.chunks, 2);
  // Stage 0 warms up with (2 - 0 - 1) + (2 - 1) * 2 = 3 forwards.
  EXPECT_EQ(describe(s.actions[0]), "F0 F1 F0c1 F1c1 B0c1 F2 B1c1 F3 B0 F2c1 B1 F3c1 B2c1 B3c1 B2 B3");
  EXPECT_EQ(describe(s.actions[1]), "F0 F1 F0c1 B0c1 F1c1 B1c1 F2 B0 F3 B1 F2c1 B2c1 F3c1 B3c1 B2 B3");
  // M not a multiple of S: the last round is shorter.
  EXPECT_EQ(describe(interleaved_schedule(2, 3, 2).actions[0]),
            "F0 F1 F0c1 F1c1 B0c1 F2 B1c1 F2c1 B0 B1 B2c1 B2");
  // One chunk per stage is 1F1B.
  for (int64_t stages : {1, 2, 4}) {
    for (int64_t m : {1, 3, 8}) {
      EXPECT_EQ(interleaved_schedule(stages, m, 1).actions, one_f_one_b_schedule(stages, m).actions);
    }
  }
  EXPECT_EQ(make_pipeline_schedule("interleaved", 3, 6, 2).actions, interleaved_schedule(3, 6, 2).actions);
}

// With M a multiple of S, interleaving V chunks per stage gives the bubble
// (S - 1) / (V M + S - 1) on every stage, for backwards as long as
// forwards or twice as long.
TEST(PipelineScheduleTest, InterleavedBubbleShrinksByTheChunks) {
  for (int64_t stages : {2, 3, 4}) {
    for (int64_t chunks : {2, 3, 4}) {
      for (int64_t m = stages; m <= 16; m += stages) {
        const double want = double(stages - 1) / double(chunks * m + stages - 1);
        for (double backward : {1.0, 2.0}) {
          auto sim = simulate(interleaved_schedule(stages, m, chunks), 1.0, backward);
          EXPECT_DOUBLE_EQ(sim.makespan, (1.0 + backward) * double(chunks * m + stages - 1))
              << stages << " stages, " << chunks << " chunks, " << m << " micro-batches";
          for (double idle : sim.idle_share) EXPECT_NEAR(idle, want, 1e-12);
        }
      }
    }
  }
}

// Any M: no deadlock, never slower than 1F1B on the same model (a chunk's
// action is 1/V of a stage's), and at most (S - s - 1) + (V - 1) S + 1
// chunk-micro-batches in flight on stage s.
TEST(PipelineScheduleTest, InterleavedCompletesForAnyMicroBatchCount) {
  for (int64_t stages = 1; stages <= 6; ++stages) {
    for (int64_t chunks = 1; chunks <= 4; ++chunks) {
      for (int64_t m = 1; m <= 20; ++m) {
        const double v = double(chunks);
        auto sim = simulate(interleaved_schedule(stages, m, chunks), 1.0 / v, 2.0 / v);
        auto plain = simulate(one_f_one_b_schedule(stages, m), 1.0, 2.0);
        EXPECT_LE(sim.makespan, plain.makespan + 1e-9)
            << stages << " stages, " << chunks << " chunks, " << m << " micro-batches";
        for (int64_t s = 0; s < stages; ++s) {
          EXPECT_EQ(sim.max_in_flight[s], std::min((stages - s - 1) + (chunks - 1) * stages + 1, chunks * m));
        }
      }
    }
  }
}

// Interleaved dependencies cross from the last stage back to the first:
// chunk c + 1 of stage 0 takes its input from chunk c of stage S - 1.
TEST(PipelineScheduleTest, InterleavedSimulationRespectsDependencies) {
  const int64_t S = 3, M = 5, V = 2;
  auto schedule = interleaved_schedule(S, M, V);
  auto sim = simulate(schedule, 1.0, 2.0);
  // Start times by model piece c * S + s and micro-batch.
  std::vector<std::vector<double>> f(S * V, std::vector<double>(M)), b(S * V, std::vector<double>(M));
  for (int64_t s = 0; s < S; ++s) {
    for (size_t k = 0; k < schedule.actions[s].size(); ++k) {
      const auto& a = schedule.actions[s][k];
      (a.op == PipelineOp::kForward ? f : b)[a.chunk * S + s][a.micro_batch] = sim.start[s][k];
    }
  }
  for (int64_t piece = 0; piece < S * V; ++piece) {
    for (int64_t i = 0; i < M; ++i) {
      if (piece > 0) EXPECT_GE(f[piece][i], f[piece - 1][i] + 1.0);
      if (piece + 1 < S * V) EXPECT_GE(b[piece][i], b[piece + 1][i] + 2.0);
      EXPECT_GE(b[piece][i], f[piece][i] + 1.0);
    }
  }
}

TEST(PipelineScheduleTest, BadSchedulesAreNamed) {
  auto s = gpipe_schedule(2, 2);
  s.actions[1] = {{PipelineOp::kForward, 0}, {PipelineOp::kBackward, 1}, {PipelineOp::kBackward, 0},
                  {PipelineOp::kForward, 1}};
  EXPECT_EQ(testing::error_of([&] { simulate(s); }), "gpipe: stage 1 runs B1 before F1");
  // Stage 0 wants B0 before sending F1, stage 1 wants F1 before B0.
  s.actions[0] = {{PipelineOp::kForward, 0}, {PipelineOp::kBackward, 0}, {PipelineOp::kForward, 1},
                  {PipelineOp::kBackward, 1}};
  s.actions[1] = {{PipelineOp::kForward, 0}, {PipelineOp::kForward, 1}, {PipelineOp::kBackward, 0},
                  {PipelineOp::kBackward, 1}};
  EXPECT_EQ(testing::error_of([&] { simulate(s); }), "gpipe: deadlock: stage 0 waits forever at B0");
  EXPECT_EQ(testing::error_of([] { make_pipeline_schedule("zigzag", 2, 2); }),
            "--schedule: expected gpipe, 1f1b or interleaved, got 'zigzag'");
  EXPECT_EQ(testing::error_of([] { make_pipeline_schedule("1f1b", 2, 4, 2); }),
            "--virtual-stages 2: more than one chunk per stage needs --schedule interleaved, not 1f1b");
  EXPECT_EQ(testing::error_of([] { interleaved_schedule(2, 4, 0); }),
            "--virtual-stages: expected at least 1, got 0");
  auto chunked = interleaved_schedule(2, 2, 2);
  chunked.actions[0][0].chunk = 2;
  EXPECT_EQ(testing::error_of([&] { simulate(chunked); }),
            "interleaved: stage 0 has F0c2 but there are 2 chunks per stage");
  chunked = interleaved_schedule(2, 2, 2);
  chunked.actions[1].pop_back();
  EXPECT_EQ(testing::error_of([&] { simulate(chunked); }), "interleaved: stage 1 never runs B1");
  EXPECT_EQ(testing::error_of([] { gpipe_schedule(2, 0); }),
            "--micro-batches: expected at least 1, got 0");
}

}  // namespace
}  // namespace tandem::parallel
