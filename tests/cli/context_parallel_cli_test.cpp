// Context parallelism from the CLI: a dp x cp job of real workers ends
// with one process's weights; what it does not do yet is refused by name,
// before any worker starts.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::TempDir;

// llama-tiny over dp=2 x cp=2 (its workers, rendezvous, ring attention
// over Gloo between processes, and export) ends with one process's weights
// after four steps. The other layouts are tests/layout's, in threads.
// Control: another learning rate.
TEST(ContextParallelCliTest, ADataTimesContextParallelJobIsOneProcess) {
  TempDir text;
  const std::string model =
      "--model llama-tiny --data text:" + testing::write_text(text) + " --seq-len 16 --dtype float64 --lr 1e-3 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 4 --mesh dp=2,cp=2"}, model, 1e-10,
                               model + " --lr 2e-3 --nproc-per-node 0", {/*threads=*/false, /*steps=*/4});
}

TEST(ContextParallelCliTest, WhatIsNotAvailableYetIsNamed) {
  TempDir dir;
  const std::string text = "--data text:" + testing::write_text(dir) + " --seq-len 16 --max-steps 1 --progress off ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model gpt2-tiny --nproc-per-node 4 --mesh cp=4 --seq-len 12",
       "--seq-len 12: context parallelism over cp=4 (--mesh cp=4) cuts each sequence into 8 equal chunks; give a "
       "length that 8 divides"},
      {"--model gpt2-tiny --nproc-per-node 2 --mesh cp=2 --dropout 0.1",
       "context parallelism with --dropout is not supported yet"},
  };
  for (const auto& [flags, expected] : cases) {
    const auto run = testing::run_tandem("train " + text + flags);
    EXPECT_EQ(run.exit_code, 2) << flags << "\n" << run.output;
    EXPECT_EQ(run.output.find("[rank"), std::string::npos) << run.output;  // before any worker
    EXPECT_NE(run.output.find(expected), std::string::npos) << run.output;
  }
  EXPECT_TRUE(testing::tandem_fails("train --model convnet --nproc-per-node 2 --mesh cp=2 --max-steps 1", 2,
                                    "context parallelism splits a language model's sequences; convnet is an image"));
}

}  // namespace
}  // namespace tandem
