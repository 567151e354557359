// `tandem train --amp bf16|fp16`: mixed precision from the command line.
#include <gtest/gtest.h>

#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

TEST(AmpCliTest, ModesAreReported) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 128, 32);
  auto common = "train --data idx:" + dir.path() + " --model mlp --batch-size 32 --epochs 1 --progress lines";
  auto r = run_tandem(common + " --amp bf16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mixed precision: bf16 autocast"), std::string::npos) << r.output;
  r = run_tandem(common + " --amp fp16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("mixed precision: fp16 autocast with dynamic loss scaling"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("fp16 loss scale "), std::string::npos) << r.output;
}

TEST(AmpCliTest, BadCombinationsAreNamed) {
  EXPECT_TRUE(testing::tandem_fails("train --amp fp8 --max-steps 1", 2, "--amp"));
  EXPECT_TRUE(testing::tandem_fails("train --amp bf16 --dtype float64 --max-steps 1", 2,
                                    "--amp bf16 needs --dtype float32"));
}

// Pipelines autocast each micro-batch's forward in its stage (and scale each
// loss for fp16), and learn the synthetic task as the plain step does.
TEST(AmpCliTest, PipelinesTrainInBf16AndFp16) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 256);
  for (std::string amp : {"bf16", "fp16"}) {
    auto metrics = dir.path() + "/" + amp + ".jsonl";
    auto r = run_tandem("train --data idx:" + dir.path() + " --model convnet --batch-size 64 --epochs 2 "
                        "--lr 0.05 --progress lines --strategy pipeline --devices cpu,cpu "
                        "--micro-batches 2 --amp " + amp + " --metrics-out " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("mixed precision: " + amp), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("pipeline over cpu,cpu"), std::string::npos) << r.output;
    EXPECT_GT(testing::last_metrics(metrics)["test_acc"].get<double>(), 0.8) << amp << "\n" << r.output;
  }
}

}  // namespace
}  // namespace tandem
