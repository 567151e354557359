// Note [diverged] from the command line: a run whose loss or weights stop
// being finite, at any step, ends with an error before any checkpoint,
// metrics line or export of them is written, and says what the run shows
// to be the cause; weights that give no finite loss are no result in
// `tandem eval` either.
#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "tandem/checkpoint/safetensors.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::TempDir;

class DivergenceCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    testing::write_synthetic_idx(data_->path(), 512, 64);
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static std::string data() { return " --data idx:" + data_->path() + " "; }
  static TempDir* data_;
};
TempDir* DivergenceCliTest::data_ = nullptr;

// The case: three steps at a learning rate of 10000 leave weights
// of about 1e25 and a finite training loss; the evaluation's loss is NaN.
// Nothing is written. The same run at --lr 0.1 is the control: it writes
// all three.
TEST_F(DivergenceCliTest, AFewStepsToHugeWeightsWriteNothing) {
  for (const char* lr : {"10000", "0.1"}) {
    TempDir out;
    auto r = testing::run_tandem("train" + data() + "--batch-size 64 --warmup-epochs 0 --max-steps 3 --progress off --lr " +
                                 lr + " --checkpoint-dir " + out.file("ck") + " --export-weights " +
                                 out.file("w.safetensors") + " --metrics-out " + out.file("m.jsonl"));
    const bool diverges = std::string(lr) == "10000";
    EXPECT_EQ(r.exit_code, diverges ? 1 : 0) << r.output;
    EXPECT_EQ(r.output.find("training diverged: ") != std::string::npos, diverges) << r.output;
    EXPECT_EQ(std::filesystem::exists(out.file("w.safetensors")), !diverges) << r.output;
    int checkpoints = 0;
    for (const auto& entry : std::filesystem::directory_iterator(out.file("ck"))) {
      checkpoints += entry.path().extension() == ".pt";
    }
    EXPECT_EQ(checkpoints, diverges ? 0 : 1) << r.output;
    EXPECT_EQ(testing::last_metrics(out.file("m.jsonl")).is_null(), diverges) << r.output;
    if (diverges) {
      EXPECT_NE(r.output.find("stopped before writing a checkpoint of it: the learning rate was "), std::string::npos)
          << r.output;
    }
  }
}

TEST_F(DivergenceCliTest, AWeightDecayThatGrowsTheWeightsIsNamed) {
  auto r = testing::run_tandem("train" + data() + "--batch-size 16 --epochs 2 --progress off --lr 0.1 --weight-decay 100");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("training diverged: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(": the weight decay alone makes the weights grow: learning rate "), std::string::npos)
      << r.output;
}

// Weights of a diverged run (finite, but huge) given to --init-weights and
// to tandem eval.
TEST_F(DivergenceCliTest, HugeWeightsAreNamedInTrainAndEval) {
  TempDir out;
  auto r = testing::run_tandem("train" + data() + "--batch-size 64 --max-steps 2 --progress off --export-weights " +
                               out.file("w.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto file = checkpoint::read_safetensors(out.file("w.safetensors"));
  checkpoint::NamedTensors huge;
  for (const auto& [name, tensor] : file.tensors) {
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    huge.emplace_back(name, weight ? tensor * 1e20 : tensor);
  }
  checkpoint::write_safetensors(out.file("huge.safetensors"), huge, file.metadata);

  r = testing::run_tandem("train" + data() + "--batch-size 64 --max-steps 20 --progress off --init-weights " +
                          out.file("huge.safetensors"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(": the weights were already huge when the run started (|value| up to "), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("from --init-weights " + out.file("huge.safetensors")), std::string::npos) << r.output;

  r = testing::run_tandem("eval --weights " + out.file("huge.safetensors") + data());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(out.file("huge.safetensors") + ": these weights give a test loss of "), std::string::npos)
      << r.output;
  r = testing::run_tandem("eval --weights " + out.file("w.safetensors") + data());  // the control
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace tandem
