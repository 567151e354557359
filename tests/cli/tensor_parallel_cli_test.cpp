// Tensor parallelism from the CLI: a job of tp workers ends with one
// process's weights; what tensor parallelism does not do yet is refused
// by name.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::expect_same_weights;
using testing::TempDir;

// A tp job through the CLI (its workers, rendezvous and export), the
// pipeline and sequence parallelism on: gpt2-tiny over pp=2 x tp=2 ends
// with one process's weights after six steps. Every other layout, and
// resuming across them, is the generated matrix's
// (tests/layout/matrix_layout_test.cpp), in threads. Control: another beta2.
TEST(TensorParallelCliTest, APipelinedTensorParallelJobIsOneProcess) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 --clip-grad-norm 0.5 ";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel"}, model,
                      1e-10, model + " --beta2 0.99 --nproc-per-node 0", {/*threads=*/false, /*steps=*/6});
}

// Note [dropout under tp]: with --dropout every tp rank drops its part of
// the mask one process draws (the attention's heads, and under sequence
// parallelism the sequence's positions), so tp=2, and tp=2 with sequence
// parallelism and activation checkpointing (whose recomputation draws the
// same masks again), end with one process's weights. Real processes: the
// masks come from each process's own generator. Control: no dropout.
TEST(TensorParallelCliTest, DropoutUnderTpIsOneProcesssDropout) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 ";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2",
                       "--nproc-per-node 2 --mesh tp=2 --sequence-parallel --checkpoint-activations 2"},
                      model + "--dropout 0.2 ", 1e-10, model + " --nproc-per-node 0",
                      {/*threads=*/false, /*steps=*/4});
}

// Note [dropout seeds]: each step's masks come from (--seed, the step, the
// stage), so under a pipeline with dropout the default balance (by
// parameter count: measured times differ from run to run) equals the
// split it makes, given, pp=2 x tp=2 equals pp=2, and a run stopped at
// step 2 and resumed (a later stage's generator not in the checkpoint)
// ends where the uninterrupted one does. A measured balance with dropout
// is refused. Real processes, float64. Controls: no dropout; the weights
// halfway.
TEST(TensorParallelCliTest, DropoutUnderAPipelineResumesExactly) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 --dropout 0.2 ";
  const testing::RunStyle processes{/*threads=*/false, /*steps=*/4};
  expect_same_weights({"--nproc-per-node 2 --mesh pp=2 --pipeline-split h2", "--nproc-per-node 2 --mesh pp=2",
                       "--nproc-per-node 4 --mesh pp=2,tp=2 --pipeline-split h2"},
                      model, 1e-10, model + "--dropout 0 --nproc-per-node 2 --mesh pp=2 --pipeline-split h2",
                      processes);
  TempDir dir;
  const std::string resumed = "--model gpt2-tiny --data text:" + testing::write_text(dir) +
                              " --seq-len 16 --dtype float64 --dropout 0.2 ";
  testing::expect_resumes_as_uninterrupted(dir, resumed, "--lr 1e-3 --nproc-per-node 2 --mesh pp=2",
                                           {"--lr 1e-3 --nproc-per-node 2 --mesh pp=2"}, "pp=2 with dropout", 1e-10,
                                           processes);
  EXPECT_TRUE(testing::tandem_fails("train " + model + "--nproc-per-node 2 --mesh pp=2 --pipeline-balance time", 2,
                                    "--pipeline-balance time with --dropout"));
}

TEST(TensorParallelCliTest, WhatIsNotAvailableYetIsNamed) {
  TempDir dir;
  const std::string text = "--data text:" + testing::write_text(dir) + " --seq-len 16 --max-steps 1 --progress off ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model gpt2-tiny --nproc-per-node 3 --mesh tp=3 --batch-size 30", "3 ranks do not divide the model's 4 heads"},
      {"--model gpt2-tiny --nproc-per-node 2 --sequence-parallel", "give --mesh with tp > 1"},
      {"--model llama-tiny --nproc-per-node 2 --mesh tp=2 --sequence-parallel --seq-len 15",
       "--sequence-parallel: sequences of 15 tokens (--seq-len) do not split into 2 equal parts"},
  };
  for (const auto& [flags, expected] : cases) {
    EXPECT_TRUE(testing::tandem_fails("train " + text + flags, 2, expected)) << flags;
  }
  EXPECT_TRUE(testing::tandem_fails("train " + text + "--model llama-tiny --dropout 0.1", 2,
                                    "--dropout is GPT-2's (its embeddings, attention and residuals); --model "
                                    "llama-tiny has no dropout to set"));
  EXPECT_TRUE(testing::tandem_fails("train " + text + "--model gpt2-tiny --dropout 1", 2,
                                    "--dropout: expected a probability from 0 up to, not including, 1, got 1"));
  // Named once, before any worker starts (not by each of the 3).
  const auto heads = testing::run_tandem("train " + text + "--model gpt2-tiny --nproc-per-node 3 --mesh tp=3");
  EXPECT_EQ(heads.exit_code, 2) << heads.output;
  EXPECT_EQ(heads.output.find("[rank"), std::string::npos) << heads.output;
  EXPECT_NE(heads.output.find("tandem: error: --mesh tp=3: tensor parallelism: 3 ranks do not divide the model's 4 "
                              "heads"), std::string::npos) << heads.output;
  EXPECT_TRUE(testing::tandem_fails("train --model convnet --nproc-per-node 2 --mesh tp=2 --max-steps 1", 2,
                                    "tensor parallelism splits a language model's layers; convnet is an image"));
}

}  // namespace
}  // namespace tandem
