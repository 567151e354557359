// `tandem train --strategy pipeline --devices LIST`: the model cut into
// stages, micro-batches flowing through them, in one process.
#include <gtest/gtest.h>

#include "testing.h"

namespace tandem {
namespace {

using testing::last_metrics;
using testing::run_tandem;
using testing::TempDir;

// Issue 5's check as a learning check (Note [a learning check on
// Fashion-MNIST]): convnet on Fashion-MNIST over cpu,cpu with 4
// micro-batches, interleaved 1F1B (two chunks per device). Every schedule
// is one process's arithmetic in float64 (tests/layout/); each says how it
// cut the model and how idle its stages were.
TEST(PipelineCliTest, ConvnetLearnsFashionMnistOverTwoCpuStages) {
  TempDir dir;
  auto r = run_tandem(std::string("train --strategy pipeline --devices cpu,cpu --micro-batches 4 --schedule "
                                  "interleaved --data fashion-mnist --model convnet --progress lines") +
                      testing::kLearningSteps + "--metrics-out " + dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto m = last_metrics(dir.file("m.jsonl"));
  EXPECT_GE(m["test_acc"].get<double>(), testing::kLearnedAccuracy) << r.output;
}

class PipelineCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(PipelineCliTest, EachScheduleSaysHowItCutAndWaited) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 16);
  auto r = run_tandem("train --strategy pipeline --devices cpu,cpu --micro-batches 4 --schedule " + GetParam() +
                      " --data idx:" + dir.path() + " --model convnet --batch-size 64 --epochs 1 --progress lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Where the time balance cuts depends on the machine's timings; that it
  // cuts and says so does not.
  EXPECT_NE(r.output.find("pipeline over cpu,cpu in one process: stages conv1"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" | "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fc2 (balanced by measured time)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("4 micro-batches, " + GetParam() + " schedule"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("pipeline: stage idle share "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cpu,cpu (pipeline, one process)"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Schedules, PipelineCliTest, ::testing::Values("gpipe", "1f1b", "interleaved"));

// The same over two processes, one stage each (Note [pipeline over ranks]):
// rank 0 reports, the accuracy coming from the last stage.
TEST(PipelineRanksTest, ConvnetLearnsFashionMnistOverTwoRanks) {
  TempDir dir;
  auto r = run_tandem(std::string("train --nproc-per-node 2 --strategy pipeline --micro-batches 4 --data "
                                  "fashion-mnist --model convnet --progress lines") +
                      testing::kLearningSteps + "--metrics-out " + dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 0] pipeline over 2 ranks, one stage per rank on its device (rank 0: cpu): "
                          "stages conv1"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("fc2 (balanced by measured time on rank 0); 4 micro-batches, 1f1b schedule"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] pipeline: stage idle share "), std::string::npos) << r.output;
  auto m = last_metrics(dir.file("m.jsonl"));
  EXPECT_EQ(m["world_size"].get<int64_t>(), 2);
  EXPECT_GE(m["test_acc"].get<double>(), testing::kLearnedAccuracy) << r.output;
  // A whole epoch ends with the devices table (a short one here).
  testing::write_synthetic_idx(dir.path(), 256, 16);
  r = run_tandem("train --nproc-per-node 2 --strategy pipeline --micro-batches 4 --data idx:" + dir.path() +
                 " --model convnet --batch-size 64 --epochs 1 --progress lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("2 x cpu (pipeline, a stage each) | 64           | 64"), std::string::npos) << r.output;
}

// Note [micro-batches on resume]: resuming with another --micro-batches is
// allowed (the same sums to rounding), but with BatchNorm, which
// normalises each micro-batch, it is said to change the arithmetic.
TEST(PipelineCliOptionsTest, ResumingWithOtherMicroBatchesIsSaidWhereBatchNormCares) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  for (const std::string model : {"convnet", "mlp"}) {
    TempDir checkpoints;
    const std::string common = "train --strategy pipeline --devices cpu,cpu --data idx:" + dir.path() + " --model " +
                               model + " --batch-size 16 --progress lines --checkpoint-dir " + checkpoints.path();
    auto r = run_tandem(common + " --max-steps 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_tandem(common + " --max-steps 3 --resume --micro-batches 2");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const std::string warning = "tandem: warning: the checkpoint was written with --micro-batches 4, this run has 2: " +
                                model + "'s BatchNorm normalises each micro-batch on its own";
    EXPECT_EQ(r.output.find(warning) != std::string::npos, model == "convnet") << r.output;
  }
}

// An explicit split and a split by parameter count are reported as given;
// the run can be resumed from its checkpoint like any other.
TEST(PipelineCliOptionsTest, SplitsAreReported) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  auto common = "train --strategy pipeline --devices cpu,cpu,cpu --data idx:" + dir.path() +
                " --model mlp --batch-size 16 --max-steps 2 --progress lines";
  auto r = run_tandem(common + " --pipeline-split relu1,fc3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stages flatten..fc1 | relu1..relu2 | fc3 (--pipeline-split)"),
            std::string::npos) << r.output;
  r = run_tandem(common + " --pipeline-balance params");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stages flatten..relu1 | fc2..relu2 | fc3 (balanced by parameter count)"),
            std::string::npos) << r.output;
  // Interleaved: devices x --virtual-stages pieces, device d running pieces
  // d, d + 2, ...
  common = "train --strategy pipeline --devices cpu,cpu --schedule interleaved --data idx:" + dir.path() +
           " --model mlp --batch-size 16 --max-steps 2 --progress lines";
  r = run_tandem(common + " --pipeline-split fc1,fc2,fc3");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stages flatten | fc1..relu1 | fc2..relu2 | fc3 (--pipeline-split); 4 "
                          "micro-batches, interleaved schedule (2 chunks per device: device d runs "
                          "stages d, d + 2, ...)"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(p-1)/(vm+p-1) = 0.11)"), std::string::npos) << r.output;
  // 3 micro-batches over 2 stages: no closed form for the bubble, the
  // schedule's own simulated one is printed (5/23, where (p-1)/(vm+p-1) = 1/7
  // and 1F1B's (p-1)/(m+p-1) = 1/4).
  r = run_tandem(common + " --micro-batches 3 --pipeline-balance params");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(mean over 2 steps; the schedule's, simulated = 0.22)"), std::string::npos)
      << r.output;
  r = run_tandem(common + " --virtual-stages 3 --pipeline-balance params");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stages flatten | fc1 | relu1 | fc2 | relu2 | fc3 (balanced by parameter "
                          "count); 4 micro-batches, interleaved schedule (3 chunks per device"),
            std::string::npos) << r.output;
}

TEST(PipelineCliOptionsTest, BadOptionsAreNamed) {
  EXPECT_TRUE(testing::tandem_fails("train --strategy pipeline --max-steps 1", 2,
                                    "--strategy pipeline needs --devices"));
  EXPECT_TRUE(testing::tandem_fails("train --micro-batches 8 --max-steps 1", 2,
                                    "--micro-batches goes with a pipeline (--strategy pipeline, or --mesh with "
                                    "pp > 1); this run has none"));
  EXPECT_TRUE(testing::tandem_fails("train --virtual-stages 2 --max-steps 1", 2,
                                    "--virtual-stages goes with a pipeline"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy pipeline --devices cpu,cpu --virtual-stages 2 --max-steps 1", 2,
      "--virtual-stages 2: more than one chunk per device needs --schedule interleaved, not 1f1b"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy pipeline --devices cpu,cpu --schedule interleaved --virtual-stages -1 --max-steps 1",
      2, "--virtual-stages: expected a non-negative integer, got '-1'"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --nproc-per-node 2 --strategy pipeline --devices cpu,cpu --max-steps 1", testing::kAnyFailure,
      "--devices cpu,cpu: --strategy pipeline over 2 ranks runs one stage per rank, on its --device (cpu, or "
      "cuda:LOCAL_RANK); leave out --devices"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy pipeline --model mlp --devices cpu,cpu,cpu,cpu --schedule interleaved --max-steps 1",
      2, "the model has 6 layers, fewer than the 8 stages (4 devices x --virtual-stages 2)"));
  EXPECT_TRUE(
      testing::tandem_fails("train --strategy pipeline --devices cpu,cpu --pipeline-split fc9 --max-steps 1",
                            2, "--pipeline-split: no layer 'fc9' in the model (its layers: conv1, bn1"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy pipeline --devices cpu,cpu --schedule zigzag --max-steps 1", 2, "--schedule"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy pipeline --model mlp --devices cpu,cpu,cpu,cpu,cpu,cpu,cpu --max-steps 1", 2,
      "the model has 6 layers, fewer than the 7 stages (7 devices)"));
}

}  // namespace
}  // namespace tandem
