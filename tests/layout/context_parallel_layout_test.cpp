// Context parallelism, --mesh cp=C (Note [context parallelism] in
// parallel/context_parallel.h), the ranks as threads: each rank of a cp
// group reads its replica's samples and holds two chunks of every
// sequence, attention runs around the ring, and the gradients are averaged
// over dp x cp. gpt2-tiny (learned positions, tied head) and llama-tiny
// (rotary angles, grouped key/value heads) at cp=2, cp=4 and dp=2,cp=2,
// under DDP and FSDP, HSDP with FSDP over dp_shard x cp, and composed with tp and a pipeline, train one
// process's weights in float64 (control: another learning rate); a
// dp=2,cp=2 checkpoint resumes in one process and at cp=4 where the
// uninterrupted run ends.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace context_parallel_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;
using testing::write_text;

constexpr testing::RunStyle kRuns{/*threads=*/true, /*steps=*/4};
constexpr testing::RunStyle kResumed{/*threads=*/true, /*steps=*/6};

TEST(ContextParallelLayoutTest, GptAndLlamaOverCpRanksAreOneProcess) {
  TempDir text;
  const std::string data = " --data text:" + write_text(text) + " --seq-len 16 --dtype float64 --lr 1e-3 ";
  for (const std::string model : {"gpt2-tiny", "llama-tiny"}) {
    const std::string flags = "--model " + model + data;
    testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --mesh cp=2",
                                  "--nproc-per-node 4 --mesh dp=2,cp=2",
                                  "--nproc-per-node 4 --mesh dp=2,cp=2 --strategy fsdp --fsdp-min-unit-params 0",
                                  "--nproc-per-node 4 --mesh cp=4",
                                  "--nproc-per-node 8 --mesh dp_replicate=2,dp_shard=2,cp=2 --strategy fsdp "
                                  "--fsdp-min-unit-params 0"},
                                 flags, 1e-10, flags + " --lr 2e-3", kRuns);
  }
}

// cp composed with tp (sequence parallelism too: each tp rank a part of
// the rank's chunks) and with a pipeline over ranks (the ring inside each
// stage's cp group; GPT-2's embedding tied across the stages): gpt2-tiny
// at cp=2 x tp=2 with and without --sequence-parallel and pp=2 x cp=2,
// llama-tiny at pp=2 x cp=2 x tp=2 (8 ranks). Control: another learning
// rate.
TEST(ContextParallelLayoutTest, CpComposesWithTpAndAPipeline) {
  TempDir text;
  const std::string data = " --data text:" + write_text(text) + " --seq-len 16 --dtype float64 --lr 1e-3 ";
  const std::string gpt2 = "--model gpt2-tiny" + data, llama = "--model llama-tiny" + data;
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 4 --mesh cp=2,tp=2",
                                "--nproc-per-node 4 --mesh cp=2,tp=2 --sequence-parallel",
                                "--nproc-per-node 4 --mesh pp=2,cp=2"},
                               gpt2, 1e-10, gpt2 + " --lr 2e-3", kRuns);
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 8 --mesh pp=2,cp=2,tp=2"}, llama, 1e-10,
                               llama + " --lr 2e-3", kRuns);
}

TEST(ContextParallelLayoutTest, ACheckpointResumesUnderAnotherLayout) {
  TempDir dir;
  const std::string model = "--model llama-tiny --data text:" + write_text(dir) + " --seq-len 16 --dtype float64 ";
  testing::expect_resumes_as_uninterrupted(dir, model, "--nproc-per-node 4 --mesh dp=2,cp=2",
                                           {"--nproc-per-node 0", "--nproc-per-node 4 --mesh cp=4"}, "dp=2,cp=2",
                                           1e-10, kResumed);
}

// --metrics-out counts what the cp ring sends a step, and it is the
// note's figure: per attention layer (C-1) blocks of keys and values
// forward, (C-1) of keys, values and their gradients plus one of the
// gradients backward, a block [batch / dp, heads, T / C, head size]:
// gpt2-tiny (4 layers, 4 heads of 32) at dp=2,cp=2, float32, batch 8 of 16
// tokens: 4 x 8 blocks of 4 x 4 x 8 x 32 x 4 bytes. Received alike.
TEST(ContextParallelLayoutTest, MetricsCountTheCpRingsBytes) {
  TempDir dir;
  const std::string run = "--model gpt2-tiny --data text:" + write_text(dir) +
                          " --seq-len 16 --batch-size 8 --epochs 1 --max-steps 2 --progress off --metrics-out " +
                          dir.file("m.jsonl") + " --nproc-per-node 4 --mesh dp=2,cp=2";
  const auto job = testing::train_in_threads(run);
  ASSERT_TRUE(job.ok()) << job.report();
  const auto bytes = testing::last_metrics(dir.file("m.jsonl"))["comm_bytes_per_step"];
  ASSERT_TRUE(bytes.contains("cp")) << bytes.dump();
  const double block = 4.0 * 4 * 8 * 32 * 4;
  EXPECT_EQ(bytes["cp"]["send"].get<double>(), 4 * 8 * block) << bytes.dump();
  EXPECT_EQ(bytes["cp"]["recv"].get<double>(), 4 * 8 * block) << bytes.dump();
}

}  // namespace context_parallel_layout
}  // namespace tandem
