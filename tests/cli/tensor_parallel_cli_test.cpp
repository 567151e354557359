// Tensor parallelism from the CLI (--mesh with tp, alone or with dp and
// pp, --sequence-parallel): gpt2-tiny and llama-tiny trained 20 steps in
// float64 end with one process's weights (the exported whole model), with
// a control run that must fail the bound; checkpoints resume at any tp;
// what tensor parallelism does not do yet is refused by name.
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

// Note [AdamW amplifies rounding] (language_model_cli_test.cpp): 1e-10.
// GPT-2 (tied embedding, cut by vocabulary rows on both ends) with AdamW
// and clipping (each cut parameter's parts counted once, a whole one on
// the first tp rank only; 0.5 clips every step of this run) on tp=2,
// dp=2 x tp=2 (DDP over each tp coordinate's replicas with ZeRO-1, and
// FSDP over them: clipping counts the runs of its flat shards that hold
// cut parameters on every tp rank, the rest on the first), tp=2 with
// sequence parallelism (Note [sequence-parallel plans]: norms, residuals
// and positions on half the sequence each), pp=2 x tp=2 with it (each
// stage's layers split over its tp pair), and all three dimensions on 8
// ranks, dp=2 x pp=2 x tp=2 (the tie between the stages' tp parts,
// clipping over each replica's pp x tp ranks). Control: another beta2.
TEST(TensorParallelCliTest, Gpt2OnEveryMeshIsOneProcess) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 --clip-grad-norm 0.5 ";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2",
                       "--nproc-per-node 4 --mesh dp=2,tp=2 --shard-optimizer",
                       "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --fsdp-min-unit-params 0",
                       "--nproc-per-node 2 --mesh tp=2 --sequence-parallel",
                       "--nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel",
                       "--nproc-per-node 8 --mesh pp=2,dp=2,tp=2"},
                      model, 1e-10, model + " --beta2 0.99");
}

// LLaMA (grouped-query heads, SwiGLU, an untied head; RMSNorm on the
// sequence's parts, rotary positions inside the gathered regions) with SGD
// and label smoothing (the vocabulary-parallel loss's smoothing term) on
// tp=2 with activation checkpointing (the recomputed regions' collectives
// run again in backward), FSDP over dp=2 x tp=2, DDP over it with
// sequence parallelism, pp=2 x tp=2, and dp=2 x pp=2 x tp=2 with sequence
// parallelism. Control: another momentum.
TEST(TensorParallelCliTest, LlamaOnEveryMeshIsOneProcess) {
  TempDir text;
  const std::string model = "--model llama-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --optimizer sgd --lr 0.05 --label-smoothing 0.1 ";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2 --checkpoint-activations 2",
                       "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp",
                       "--nproc-per-node 4 --mesh dp=2,tp=2 --sequence-parallel", "--nproc-per-node 4 --mesh pp=2,tp=2",
                       "--nproc-per-node 8 --mesh pp=2,dp=2,tp=2 --sequence-parallel"},
                      model, 1e-12, model + " --momentum 0.5");
}

// Note [tensor-parallel checkpoints]: a checkpoint holds the whole model
// and AdamW's state over it, whatever tp wrote it. Stopped at step 10,
// dp=2 x tp=2 with ZeRO-1 (a sharded checkpoint: each tp rank's parts as
// runs of the whole tensors, the state by its dp owner) resumes in one
// process, as pp=2 x tp=2 with sequence parallelism and as FSDP over
// dp=2 x tp=2; FSDP over dp=2 x tp=2 writes one file (its shards of the
// parts made whole), which resumes at tp=2 with sequence parallelism.
// Each ends where 20 uninterrupted steps do; the control is the weights
// at step 10.
TEST(TensorParallelCliTest, CheckpointsResumeAtAnyTensorSize) {
  TempDir dir;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(dir) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 ";
  const std::string fsdp = "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --fsdp-min-unit-params 0";
  testing::expect_resumes_as_uninterrupted(
      dir, model, "--nproc-per-node 4 --mesh dp=2,tp=2 --shard-optimizer",
      {"--lr 1e-3 --nproc-per-node 0", "--lr 1e-3 --nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel",
       "--lr 1e-3 " + fsdp},
      "gpt2-tiny, dp=2 x tp=2", 1e-10);
  TempDir file;
  testing::train_and_export(file, model + fsdp, "whole.safetensors");
  auto r = testing::resume_after_ten_steps(file, model, fsdp + " --checkpoint-every 4",
                                           "--lr 1e-3 --nproc-per-node 2 --mesh tp=2 --sequence-parallel", "ckpt",
                                           "resumed.safetensors");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint-00000010.pt (epoch"), std::string::npos) << r.output;
  testing::expect_close_weights(file, "whole.safetensors", {{"resumed.safetensors", "FSDP x tp=2, one file, then tp=2"}},
                                1e-10, "first-half.safetensors");
}

// fp16 with the loss scaler: the vocabulary-parallel loss is float32, as
// autocast's cross_entropy is, so the scaled loss (x 2^16) does not
// overflow half: no step is skipped, as in one process (a sweep found tp
// skipping its first step, and training on other weights).
TEST(TensorParallelCliTest, HalfPrecisionSkipsNoStep) {
  TempDir dir;
  const std::string run = "train --model gpt2-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --epochs 1 --max-steps 3 --amp fp16 --progress lines ";
  for (const std::string ranks : {"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2 --sequence-parallel"}) {
    const auto r = testing::run_tandem(run + ranks);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("loss scale 65536 after this epoch; 0 step(s) skipped"), std::string::npos)
        << ranks << ":\n" << r.output;
  }
}

TEST(TensorParallelCliTest, WhatIsNotAvailableYetIsNamed) {
  TempDir dir;
  const std::string text = "--data text:" + testing::write_text(dir) + " --seq-len 16 --max-steps 1 --progress off ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--model gpt2-tiny --nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --sequence-parallel",
       "--sequence-parallel with --strategy fsdp is not available yet"},
      {"--model gpt2-tiny --nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --checkpoint-format sharded "
       "--checkpoint-dir " + dir.file("s"),
       "--checkpoint-format sharded with --strategy fsdp and tp is not available yet"},
      {"--model gpt2-tiny --nproc-per-node 3 --mesh tp=3 --batch-size 30", "3 ranks do not divide the model's 4 heads"},
      {"--model gpt2-tiny --nproc-per-node 2 --sequence-parallel", "give --mesh with tp > 1"},
      {"--model llama-tiny --nproc-per-node 2 --mesh tp=2 --sequence-parallel --seq-len 15",
       "--sequence-parallel: sequences of 15 tokens (--seq-len) do not split into 2 equal parts"},
  };
  for (const auto& [flags, expected] : cases) {
    EXPECT_TRUE(testing::tandem_fails("train " + text + flags, 2, expected)) << flags;
  }
  EXPECT_TRUE(testing::tandem_fails("train --model convnet --nproc-per-node 2 --mesh tp=2 --max-steps 1", 2,
                                    "tensor parallelism splits a language model's layers; convnet is an image"));
}

}  // namespace
}  // namespace tandem
