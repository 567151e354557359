// Tensor parallelism (--mesh with tp, --sequence-parallel), the ranks as
// threads, beside the generated matrix (matrix_layout_test.cpp): llama-tiny
// with activation checkpointing under tp, checkpoints resumed at any tp,
// and fp16's loss scale skipping no step. The CLI's own test of a tp job
// is tests/cli/tensor_parallel_cli_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
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

// Every layout of dp x pp x tp x sp against one process is the generated
// matrix's (matrix_layout_test.cpp); these are what it leaves out.

// LLaMA (grouped-query heads, SwiGLU, an untied head) with SGD and label
// smoothing on tp=2 without dp, with activation checkpointing: the
// recomputed regions' collectives run again in backward. Control: another
// momentum.
TEST(TensorParallelLayoutTest, LlamaWithRecomputedRegionsIsOneProcess) {
  TempDir text;
  const std::string model = "--model llama-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --optimizer sgd --lr 0.05 --label-smoothing 0.1 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2 --checkpoint-activations 2"},
                               model, 1e-12, model + " --momentum 0.5", kSixSteps);
}

// A model built from a transformers config.json (--model hf:DIR): LLaMA
// with attention_bias and mlp_bias, so that every projection has a bias,
// cut with its weight's rows (q, k, v, gate, up) or whole and added once
// after the sum (o, down), on tp=2, with sequence parallelism, and under
// a pipeline. Control: another momentum.
TEST(TensorParallelLayoutTest, BiasedProjectionsOfATransformersConfigAreOneProcess) {
  TempDir text;
  std::ofstream(text.file("config.json")) << R"({"model_type": "llama", "vocab_size": 256, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 64, "rms_norm_eps": 1e-05, "attention_bias": true, "mlp_bias": true,
    "tie_word_embeddings": false, "hidden_act": "silu"})";
  const std::string model = "--model hf:" + text.path() + " --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --optimizer sgd --lr 0.05 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh tp=2",
                                "--nproc-per-node 2 --mesh tp=2 --sequence-parallel",
                                "--nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel"},
                               model, 1e-12, model + " --momentum 0.5", kSixSteps);
}

// Note [fsdp shards]: FSDP cuts each parameter's rows, so a whole
// parameter's shards are the same on every tp rank even where tp cuts the
// embedding unevenly (257 rows as 129 and 128), and sequence parallelism's
// sum of its partial gradients over tp composes with FSDP. Control:
// another beta2.
TEST(TensorParallelLayoutTest, FsdpWithSequenceParallelismOverAnUnevenVocabularyIsOneProcess) {
  TempDir text;
  const std::string model = "--model gpt2-tiny --data text:" + testing::write_text(text) +
                            " --seq-len 16 --dtype float64 --lr 1e-3 --vocab-size 257 ";
  testing::expect_same_weights(
      {"--nproc-per-node 0",
       "--nproc-per-node 4 --mesh dp=2,tp=2 --strategy fsdp --sequence-parallel --fsdp-min-unit-params 0"},
      model, 1e-10, model + " --beta2 0.99 --nproc-per-node 0", kSixSteps);
}

// Note [tensor-parallel checkpoints]: a checkpoint holds the whole model
// and AdamW's state over it, whatever tp wrote it. Stopped halfway,
// dp=2 x tp=2 with ZeRO-1 (a sharded checkpoint: each tp rank's parts as
// runs of the whole tensors, the state by its dp owner) resumes in one
// process, as pp=2 x tp=2 with sequence parallelism and as FSDP over
// dp=2 x tp=2; FSDP over dp=2 x tp=2 writes a sharded checkpoint (each
// rank its shards of its tp part as runs of the whole tensors: Note [fsdp
// x tp checkpoints]), which resumes at pp=2 x tp=2 with sequence
// parallelism.
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
                                   "--lr 1e-3 --nproc-per-node 4 --mesh pp=2,tp=2 --sequence-parallel", "ckpt",
                                   "resumed.safetensors", kEightSteps);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("checkpoint-00000004 (epoch"), std::string::npos) << r.output;
  testing::expect_close_weights(file, "whole.safetensors",
                                {{"resumed.safetensors", "FSDP x tp=2, sharded, then pp=2 x tp=2"}},
                                1e-10, "first-half.safetensors");
}

// --metrics-out's comm_bytes_per_step counts the tp group's traffic too:
// under tp=2 the regions' all-reduces; with sequence parallelism each
// becomes an all-gather and a reduce-scatter, and the all-reduces left
// (the loss's, the whole parameters' partial gradients) carry fewer bytes.
TEST(TensorParallelLayoutTest, MetricsCountTheTpGroupsTraffic) {
  TempDir dir;
  const std::string run = "--model gpt2-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --batch-size 8 --epochs 1 --max-steps 2 --progress off --metrics-out ";
  auto traffic = [&](const std::string& name, const std::string& flags) {
    const auto job = testing::train_in_threads(run + dir.file(name) + " --nproc-per-node 2 --mesh tp=2 " + flags);
    EXPECT_TRUE(job.ok()) << job.report();
    return testing::last_metrics(dir.file(name))["comm_bytes_per_step"];
  };
  const auto plain = traffic("plain.jsonl", ""), sp = traffic("sp.jsonl", "--sequence-parallel");
  ASSERT_TRUE(plain.contains("tp")) << plain.dump();
  EXPECT_GT(plain["tp"]["all_reduce"].get<double>(), 0) << plain.dump();
  EXPECT_FALSE(plain["tp"].contains("reduce_scatter")) << plain.dump();
  ASSERT_TRUE(sp.contains("tp")) << sp.dump();
  EXPECT_GT(sp["tp"]["all_gather"].get<double>(), 0) << sp.dump();
  EXPECT_GT(sp["tp"]["reduce_scatter"].get<double>(), 0) << sp.dump();
  EXPECT_LT(sp["tp"]["all_reduce"].get<double>(), plain["tp"]["all_reduce"].get<double>()) << sp.dump();
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
