// `tandem train --strategy dp --devices LIST`: DataParallel in one process.
#include <gtest/gtest.h>

#include "testing.h"

namespace tandem {
namespace {

using testing::last_metrics;
using testing::run_tandem;
using testing::TempDir;

// Issue 5's check as a learning check (Note [a learning check on
// Fashion-MNIST]): convnet on Fashion-MNIST over cpu,cpu.
TEST(DataParallelCliTest, ConvnetLearnsFashionMnistOverTwoCpuReplicas) {
  TempDir dir;
  auto r = run_tandem(std::string("train --strategy dp --devices cpu,cpu --data fashion-mnist --model convnet "
                                  "--progress lines") + testing::kLearningSteps + "--metrics-out " +
                      dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("DataParallel over cpu,cpu in one process"), std::string::npos) << r.output;
  auto m = last_metrics(dir.file("m.jsonl"));
  EXPECT_GE(m["test_acc"].get<double>(), testing::kLearnedAccuracy) << r.output;
  // A whole epoch ends with the devices table (a short one here).
  testing::write_synthetic_idx(dir.path(), 256, 16);
  r = run_tandem("train --strategy dp --devices cpu,cpu --data idx:" + dir.path() +
                 " --model convnet --batch-size 64 --epochs 1 --progress lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cpu,cpu (one process)"), std::string::npos) << r.output;
}

// Seed 000's trace: every replica's input and output shapes and device.
TEST(DataParallelCliTest, TraceShowsEachReplica) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  auto r = run_tandem("train --strategy dp --devices cpu,cpu,cpu --dp-trace --data idx:" +
                      dir.path() + " --batch-size 10 --max-steps 1 --progress off");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"replica 0 on cpu: input [4, 1, 28, 28] -> output [4, 10]",
                           "replica 1 on cpu: input [3, 1, 28, 28] -> output [3, 10]",
                           "replica 2 on cpu: input [3, 1, 28, 28] -> output [3, 10]"}) {
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "\n" << r.output;
  }
}

TEST(DataParallelCliTest, BadDeviceListsAreNamed) {
  EXPECT_TRUE(testing::tandem_fails(
      "train --strategy dp --devices cpu,gpu7 --max-steps 1", 2,
      "--devices: expected a comma-separated list of cpu, cuda or cuda:N, got 'cpu,gpu7'"));
  EXPECT_TRUE(testing::tandem_fails("train --strategy dp --max-steps 1", 2, "--strategy dp needs --devices"));
  EXPECT_TRUE(testing::tandem_fails("train --devices cpu,cpu --max-steps 1", 2,
                                    "--devices goes with --strategy dp or pipeline"));
  // Text that names no device is a usage error (exit 2), for the pipeline's
  // --devices and for --device, and named before any worker starts.
  EXPECT_TRUE(testing::tandem_fails("train --strategy pipeline --devices cpu,,cpu --max-steps 1", 2,
                                    "--devices: expected a comma-separated list of cpu, cuda or cuda:N, got 'cpu,,cpu'"));
  EXPECT_TRUE(testing::tandem_fails("train --device tpu --max-steps 1", 2,
                                    "--device: expected cpu, cuda or cuda:N, got 'tpu'"));
  // The CPU has no index: cpu:1 used to run on the one CPU, cpu:0 too.
  EXPECT_TRUE(testing::tandem_fails("train --device cpu:1 --max-steps 1", 2,
                                    "--device: expected cpu, cuda or cuda:N, got 'cpu:1' (the CPU is one device: "
                                    "cpu, without an index)"));
  EXPECT_TRUE(testing::tandem_fails("train --strategy dp --devices cpu:0,cpu --max-steps 1", 2,
                                    "--devices: expected a comma-separated list of cpu, cuda or cuda:N, got "
                                    "'cpu:0,cpu' (the CPU is one device: cpu, without an index)"));
  auto r = testing::run_tandem("train --nproc-per-node 2 --device gpu --max-steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_EQ(r.output, "tandem: error: --device: expected cpu, cuda or cuda:N, got 'gpu'\n");
}

}  // namespace
}  // namespace tandem
