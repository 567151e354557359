// Tensor parallelism (--mesh with tp, alone or with dp and pp,
// --sequence-parallel), the ranks as threads: gpt2-tiny and llama-tiny
// trained in float64 end with one process's weights (the exported whole
// model), with a control run that must fail the bound; checkpoints resume
// at any tp; fp16's loss scale skips no step. The CLI's own test of a tp
// job is tests/cli/tensor_parallel_cli_test.cpp.
#include <gtest/gtest.h>

#include <string>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace tensor_parallel_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

// Six steps: each layout's arithmetic is exact from the first step, and a
// wrong scale, a missing reduction or a part counted twice shows as 1e-3
// or more by then (the controls: 0.016 and 0.1).
constexpr testing::RunStyle kSixSteps{/*threads=*/true, /*steps=*/6};

// Note [AdamW amplifies rounding] (language_model_layout_test.cpp): 1e-10.
// GPT-2 (tied embedding, cut by vocabulary rows on both ends) with AdamW
// and clipping (each cut parameter's parts counted once, a whole one on
// the first tp rank only; 0.5 clips every step of this run) on tp=2,
// dp=2 x tp=2 (DDP over each tp coordinate's replicas with ZeRO-1, and
// FSDP over them with sequence parallelism: the whole parameters' partial
// gradients summed over tp as runs of the flat shards after FSDP's
// reduce-scatter; clipping counts the runs that hold cut parameters on
// every tp rank, the rest on the first: Note [placements]), tp=2 with
// sequence parallelism (Note [sequence-parallel plans]: norms, residuals
// and positions on half the sequence each), pp=2 x tp=2 with it (each
// stage's layers split over its tp pair), and all three dimensions on 8
// ranks, dp=2 x pp=2 x tp=2 (the tie between the stages' tp parts,
// clipping over each replica's pp x tp ranks). Control: another beta2.
TEST(TensorParallelLayoutTest, Gpt2OnEveryMeshIsOneProcess) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 --clip-grad-norm 0.5 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2",
                                "--nproc-per-node 4 --mesh dp=2,tp=2 --shard-optimizer",
                                "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --fsdp-min-unit-params 0 --sequence-parallel",
                                "--nproc-per-node 2 --mesh tp=2 --sequence-parallel",
                                "--nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel",
                                "--nproc-per-node 8 --mesh pp=2,dp=2,tp=2"},
                               model, 1e-10, model + " --beta2 0.99", kSixSteps);
}

// LLaMA (grouped-query heads, SwiGLU, an untied head; RMSNorm on the
// sequence's parts, rotary positions inside the gathered regions) with SGD
// and label smoothing (the vocabulary-parallel loss's smoothing term) on
// tp=2 with activation checkpointing (the recomputed regions' collectives
// run again in backward), FSDP over dp=2 x tp=2, DDP over it with
// sequence parallelism, pp=2 x tp=2, and dp=2 x pp=2 x tp=2 with sequence
// parallelism. Control: another momentum.
TEST(TensorParallelLayoutTest, LlamaOnEveryMeshIsOneProcess) {
  TempDir text;
  const std::string model = "--model llama-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --optimizer sgd --lr 0.05 --label-smoothing 0.1 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2 --checkpoint-activations 2",
                                "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp",
                                "--nproc-per-node 4 --mesh dp=2,tp=2 --sequence-parallel",
                                "--nproc-per-node 4 --mesh pp=2,tp=2",
                                "--nproc-per-node 8 --mesh pp=2,dp=2,tp=2 --sequence-parallel"},
                               model, 1e-12, model + " --momentum 0.5", kSixSteps);
}

// Note [tensor-parallel checkpoints]: a checkpoint holds the whole model
// and AdamW's state over it, whatever tp wrote it. Stopped halfway,
// dp=2 x tp=2 with ZeRO-1 (a sharded checkpoint: each tp rank's parts as
// runs of the whole tensors, the state by its dp owner) resumes in one
// process, as pp=2 x tp=2 with sequence parallelism and as FSDP over
// dp=2 x tp=2; FSDP over dp=2 x tp=2 writes a sharded checkpoint (each
// rank its shards of its tp part as runs of the whole tensors: Note [fsdp
// x tp checkpoints]), which resumes at tp=2 with sequence parallelism.
// Each ends where the uninterrupted run does; the control is the weights
// halfway.
TEST(TensorParallelLayoutTest, CheckpointsResumeAtAnyTensorSize) {
  constexpr testing::RunStyle kEightSteps{/*threads=*/true, /*steps=*/8};
  TempDir dir;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(dir) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 ";
  const std::string fsdp = "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --fsdp-min-unit-params 0";
  testing::expect_resumes_as_uninterrupted(
      dir, model, "--nproc-per-node 4 --mesh dp=2,tp=2 --shard-optimizer",
      {"--lr 1e-3 --nproc-per-node 0", "--lr 1e-3 --nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel",
       "--lr 1e-3 " + fsdp},
      "gpt2-tiny, dp=2 x tp=2", 1e-10, kEightSteps);
  TempDir file;
  testing::train_and_export(file, model + fsdp, "whole.safetensors", kEightSteps);
  auto r = testing::resume_halfway(file, model, fsdp + " --checkpoint-every 2",
                                   "--lr 1e-3 --nproc-per-node 2 --mesh tp=2 --sequence-parallel", "ckpt",
                                   "resumed.safetensors", kEightSteps);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint-00000004 (epoch"), std::string::npos) << r.output;
  testing::expect_close_weights(file, "whole.safetensors", {{"resumed.safetensors", "FSDP x tp=2, sharded, then tp=2"}},
                                1e-10, "first-half.safetensors");
}

// fp16 with the loss scaler: the vocabulary-parallel loss is float32, as
// autocast's cross_entropy is, so the scaled loss (x 2^16) does not
// overflow half: no step is skipped, as in one process (a sweep found tp
// skipping its first step, and training on other weights).
TEST(TensorParallelLayoutTest, HalfPrecisionSkipsNoStep) {
  TempDir dir;
  const std::string run = "--model gpt2-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --batch-size 32 --epochs 1 --max-steps 3 --amp fp16 --progress lines ";
  for (const std::string ranks : {"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2 --sequence-parallel"}) {
    const auto job = testing::train_in_threads(run + ranks);
    ASSERT_TRUE(job.ok()) << job.report();
    EXPECT_NE(job.log.find("loss scale 65536 after this epoch; 0 step(s) skipped"), std::string::npos)
        << ranks << ":\n" << job.log;
  }
}

}  // namespace tensor_parallel_layout
}  // namespace tandem
