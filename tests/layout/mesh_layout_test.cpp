// --mesh dp=2,pp=2, the ranks as threads: pipeline stages x data-parallel
// replicas (Note [replicated stages] in engine/parallel_layout.h). Every
// composition trains one process's weights on the global batch, in
// float64 to rounding, with a control run that must fail the bound; its
// checkpoints resume under any other mesh. Runs of 8 steps (a resumed one
// stops at 4).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace mesh_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

constexpr testing::RunStyle kRuns{/*threads=*/true, /*steps=*/8};
const std::string kMesh = "--nproc-per-node 4 --mesh dp=2,pp=2";

void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags, double tolerance,
                         const std::string& control_flags) {
  testing::expect_same_weights(runs, model_flags, tolerance, control_flags, kRuns);
}
void expect_resumes(const TempDir& dir, const std::string& model, const std::string& run,
                    const std::vector<std::string>& hows, const std::string& label) {
  testing::expect_resumes_as_uninterrupted(dir, model, run, hows, label, 1e-12, kRuns);
}

// 4 ranks as dp=2,pp=2: DDP x pipeline under each schedule (and with each
// stage recomputed in backward, and with a first stage of no parameters:
// flatten alone), seed 004's all-reduce x pipeline, and the shorthand
// pp=2 all give one process's weights.
// Control: another momentum.
TEST(MeshLayoutTest, DdpTimesPipelineIsOneProcessUnderEachSchedule) {
  expect_same_weights({"--nproc-per-node 0", kMesh, kMesh + " --schedule interleaved",
                       kMesh + " --schedule gpipe --checkpoint-activations 1", kMesh + " --pipeline-split fc1",
                       kMesh + " --strategy allreduce --micro-batches 2", "--nproc-per-node 2 --mesh pp=2"},
                      "--model mlp --dtype float64", 1e-12, "--model mlp --dtype float64 --momentum 0.5");
}

// FSDP x pipeline (Note [fsdp under a pipeline]): each stage's parameters,
// gradients and momentum sharded over its dp ranks, gathered once a step,
// its units' accumulated gradients reduce-scattered after the pipeline's
// backward; alone, with clipping (the norm over every stage's shards) and
// interleaved. Control: another momentum.
TEST(MeshLayoutTest, FsdpTimesPipelineIsOneProcess) {
  const std::string fsdp = kMesh + " --strategy fsdp --fsdp-min-unit-params 0";
  expect_same_weights({"--nproc-per-node 0", fsdp, fsdp + " --schedule interleaved --fsdp-sharding grad-op",
                       fsdp + " --schedule gpipe --checkpoint-activations 1"},
                      "--model mlp --dtype float64", 1e-12, "--model mlp --dtype float64 --momentum 0.5");
  expect_same_weights({"--nproc-per-node 0", fsdp}, "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12,
                      "--model mlp --dtype float64");
}

// Clipping takes the norm over all stages once (the replicas hold the same
// averaged gradients); ZeRO-1 shards each stage's momentum over its dp
// ranks (CheckpointsResumeUnderAnotherMesh trains with it too). Control:
// no clipping.
TEST(MeshLayoutTest, ClippingAndAShardedOptimizerCompose) {
  expect_same_weights({"--nproc-per-node 0", kMesh + " --shard-optimizer",
                       kMesh + " --schedule interleaved --strategy allreduce"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12, "--model mlp --dtype float64");
}

// --sync-bn over a mesh normalises each micro-batch over the stage's dp
// ranks: the dp ranks' k-th micro-batches together are the one-process
// pipeline's k-th, so convnet's BatchNorm gives that pipeline's weights.
// Control: without --sync-bn each replica normalises its half alone.
TEST(MeshLayoutTest, SyncBatchNormIsTheOneProcessPipelines) {
  expect_same_weights({"--nproc-per-node 0 --strategy pipeline --devices cpu,cpu", kMesh + " --sync-bn",
                       kMesh + " --sync-bn --schedule gpipe"},
                      "--model convnet --dtype float64", 1e-12,
                      "--model convnet --dtype float64 --nproc-per-node 4 --mesh dp=2,pp=2");
}

// A checkpoint holds the whole model and optimizer whatever the mesh: one
// written by dp=2,pp=2 resumes in one process, as a pipeline over 2 ranks
// and on 4 data-parallel ranks; one written by 4 data-parallel ranks
// resumes as dp=2,pp=2 (with the optimizer sharded). Each ends where the
// uninterrupted run does.
TEST(MeshLayoutTest, CheckpointsResumeUnderAnotherMesh) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  expect_resumes(dir, model, kMesh,
                                  {"--nproc-per-node 0", "--nproc-per-node 2 --strategy pipeline",
                                   "--nproc-per-node 4"},
                                  "dp=2,pp=2");
  TempDir other;
  testing::write_synthetic_idx(other.path(), 1024, 64);
  expect_resumes(other, model, "--nproc-per-node 4", {kMesh + " --shard-optimizer"}, "dp=4");
}

// FSDP x pipeline's checkpoints are plain SGD's over the whole model
// (Note [fsdp x pipeline checkpoints]): one written by it resumes in one
// process, as DDP x pipeline and as FSDP on 2 ranks, and one written by
// DDP x pipeline resumes as FSDP x pipeline, each ending where the
// uninterrupted run does.
TEST(MeshLayoutTest, FsdpTimesPipelineCheckpointsResumeAnywhere) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string fsdp = kMesh + " --strategy fsdp --fsdp-min-unit-params 0";
  expect_resumes(dir, model, fsdp,
                                  {"--nproc-per-node 0", kMesh, "--nproc-per-node 2 --strategy fsdp"},
                                  "FSDP x pipeline");
  TempDir other;
  testing::write_synthetic_idx(other.path(), 1024, 64);
  expect_resumes(other, model, kMesh, {fsdp + " --schedule interleaved"}, "DDP x pipeline");
}

}  // namespace mesh_layout
}  // namespace tandem
