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
  auto r = run_tandem("train --amp fp8 --max-steps 1");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--amp"), std::string::npos) << r.output;
  r = run_tandem("train --amp bf16 --dtype float64 --max-steps 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--amp bf16 needs --dtype float32"), std::string::npos) << r.output;
  r = run_tandem("train --amp fp16 --strategy pipeline --devices cpu,cpu --max-steps 1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--amp fp16 does not work with --strategy pipeline yet"), std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace tandem
