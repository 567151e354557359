// Mixture-of-experts models (mixtral-tiny, qwen3-moe-tiny) under the
// layouts every model has, the ranks as threads: data parallelism (DDP
// and FSDP: an expert no token chose still has a zero gradient, so every
// rank reduces the same tensors), tensor parallelism (each expert cut by
// features, the router whole with its gradient summed over tp, as are
// Qwen3's per-head q/k norms), a pipeline and context parallelism; each
// trains one process's weights in float64 (control: another learning
// rate). Each layout runs under one of the two models, not both (the
// suite's time).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace expert_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;
using testing::write_text;

constexpr testing::RunStyle kRuns{/*threads=*/true, /*steps=*/4};
constexpr testing::RunStyle kResumed{/*threads=*/true, /*steps=*/6};

TEST(ExpertLayoutTest, MoeModelsUnderEveryDimensionAreOneProcess) {
  TempDir text;
  const std::string data = " --data text:" + write_text(text) + " --seq-len 16 --dtype float64 --lr 1e-3 ";
  // The layouts shared between the two models (each of Qwen3-MoE's q/k
  // norms and unnormalised routing under tp, a pipeline and FSDP).
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"mixtral-tiny",
       {"--nproc-per-node 0", "--nproc-per-node 2 --mesh dp=2", "--nproc-per-node 2 --mesh tp=2 --sequence-parallel",
        "--nproc-per-node 2 --mesh cp=2"}},
      {"qwen3-moe-tiny",
       {"--nproc-per-node 0", "--nproc-per-node 2 --mesh dp=2 --strategy fsdp --fsdp-min-unit-params 0",
        "--nproc-per-node 2 --mesh tp=2", "--nproc-per-node 2 --mesh pp=2"}}};
  for (const auto& [model, runs] : layouts) {
    const std::string flags = "--model " + model + data;
    testing::expect_same_weights(runs, flags, 1e-10, flags + " --lr 2e-3", kRuns);
  }
}

// Expert parallelism (--mesh ep=E; Note [expert dispatch], [expert
// gradients]): the experts spread over ep ranks borrowed from dp x cp,
// tokens sent to their experts' ranks and back by all-to-all, the experts'
// gradients summed over the ranks holding the same ones. ep=2 and
// dp=2,ep=2 on 2 ranks, dp=4,ep=2 (two copies of each half) and dp=4,ep=4
// on 4, composed with tp, a pipeline and cp: each trains one process's
// weights in float64 (control: another learning rate).
TEST(ExpertLayoutTest, ExpertsSpreadOverEpRanksAreOneProcess) {
  TempDir text;
  const std::string data = " --data text:" + write_text(text) + " --seq-len 16 --dtype float64 --lr 1e-3 ";
  // Each layout under one of the two models.
  const std::vector<std::pair<std::string, std::vector<std::string>>> layouts = {
      {"mixtral-tiny",
       {"--nproc-per-node 0", "--nproc-per-node 2 --mesh ep=2", "--nproc-per-node 4 --mesh dp=4,ep=4",
        "--nproc-per-node 4 --mesh pp=2,dp=2,ep=2"}},
      {"qwen3-moe-tiny",
       {"--nproc-per-node 0", "--nproc-per-node 4 --mesh dp=4,ep=2", "--nproc-per-node 4 --mesh dp=2,ep=2,tp=2",
        "--nproc-per-node 2 --mesh cp=2,ep=2"}}};
  for (const auto& [model, runs] : layouts) {
    const std::string flags = "--model " + model + data;
    testing::expect_same_weights(runs, flags, 1e-10, flags + " --lr 2e-3", kRuns);
  }
  // Clipping at a norm the gradients exceed: the experts' pieces counted
  // once over ep (and over tp's parts and the stages), so every layout
  // clips by one process's norm. Control: no clipping.
  const std::string clipped = "--model mixtral-tiny" + data + "--clip-grad-norm 0.05 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 4 --mesh dp=4,ep=2",
                                "--nproc-per-node 4 --mesh dp=2,ep=2,tp=2", "--nproc-per-node 4 --mesh pp=2,dp=2,ep=2"},
                               clipped, 1e-10, "--model mixtral-tiny" + data, kRuns);
}

// --shard-optimizer under ep: the dense parameters' AdamW state sharded
// over the data ranks (ZeRO-1), each rank stepping its own experts and
// keeping their state (Note [sharded optimizer state]); a checkpoint of
// it resumes in one process and under another layout.
TEST(ExpertLayoutTest, ShardedOptimizerStateUnderEpIsOneProcess) {
  TempDir text;
  const std::string model = "--model mixtral-tiny --data text:" + write_text(text) +
                            " --seq-len 16 --dtype float64 --optimizer adamw ";
  const std::string flags = model + "--lr 1e-3 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 4 --mesh dp=4,ep=2 --shard-optimizer",
                                "--nproc-per-node 4 --mesh pp=2,dp=2,ep=2 --shard-optimizer"},
                               flags, 1e-10, flags + " --lr 2e-3", kRuns);
  testing::expect_resumes_as_uninterrupted(text, model, "--nproc-per-node 4 --mesh dp=4,ep=2 --shard-optimizer",
                                           {"--nproc-per-node 0", "--nproc-per-node 2 --mesh ep=2 --shard-optimizer"},
                                           "dp=4,ep=2 sharded optimizer", 1e-10, kResumed);
}

// Note [expert checkpoints]: a sharded checkpoint written under ep (each
// expert by the first rank holding it, with tp's parts of its features)
// resumes in one process and under other ep layouts where the
// uninterrupted run ends.
TEST(ExpertLayoutTest, AnEpCheckpointResumesUnderAnotherLayout) {
  TempDir dir;
  const std::string model = "--model qwen3-moe-tiny --data text:" + write_text(dir) + " --seq-len 16 --dtype float64 ";
  testing::expect_resumes_as_uninterrupted(dir, model, "--nproc-per-node 4 --mesh dp=2,ep=2,tp=2",
                                           {"--nproc-per-node 0", "--nproc-per-node 4 --mesh dp=4,ep=4",
                                            "--nproc-per-node 2 --mesh ep=2"},
                                           "dp=2,ep=2,tp=2", 1e-10, kResumed);
}

// Note [expert checkpoints in one file]: --checkpoint-format file under ep
// writes every expert whole (gathered over ep after tp), and a run under
// ep reads the whole file back into its own experts' rows.
TEST(ExpertLayoutTest, AnEpCheckpointFileResumesUnderAnotherLayout) {
  TempDir dir;
  const std::string model = "--model mixtral-tiny --data text:" + write_text(dir) + " --seq-len 16 --dtype float64 ";
  constexpr testing::RunStyle kInOneFile{/*threads=*/true, /*steps=*/6, "--checkpoint-format file"};
  testing::expect_resumes_as_uninterrupted(dir, model, "--nproc-per-node 4 --mesh dp=2,ep=2,tp=2",
                                           {"--nproc-per-node 0", "--nproc-per-node 4 --mesh pp=2,dp=2,ep=2"},
                                           "dp=2,ep=2,tp=2 in one file", 1e-10, kInOneFile);
}

}  // namespace expert_layout
}  // namespace tandem
