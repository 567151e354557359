// --mesh: the job's ranks as pipeline stages x data-parallel replicas
// (Note [replicated stages] in engine/parallel_layout.h). Every composition
// trains one process's weights on the global batch, in float64 to rounding,
// with a control run that must fail the bound; its checkpoints resume under
// any other mesh; its evaluation and metrics are one process's; and a mesh
// the job cannot have is a usage error naming --mesh.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::expect_resumes_as_uninterrupted;
using testing::expect_same_weights;
using testing::run_tandem;
using testing::TempDir;

const std::string kMesh = "--nproc-per-node 4 --mesh dp=2,pp=2";

// 4 ranks as dp=2,pp=2: DDP x pipeline under each schedule (and with each
// stage recomputed in backward, and with a first stage of no parameters:
// flatten alone), seed 004's all-reduce x pipeline, and the shorthand
// pp=2 all give one process's weights after 20 steps.
// Control: another momentum.
TEST(MeshCliTest, DdpTimesPipelineIsOneProcessUnderEachSchedule) {
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
TEST(MeshCliTest, FsdpTimesPipelineIsOneProcess) {
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
TEST(MeshCliTest, ClippingAndAShardedOptimizerCompose) {
  expect_same_weights({"--nproc-per-node 0", kMesh + " --shard-optimizer",
                       kMesh + " --schedule interleaved --strategy allreduce"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12, "--model mlp --dtype float64");
}

// --sync-bn over a mesh normalises each micro-batch over the stage's dp
// ranks: the dp ranks' k-th micro-batches together are the one-process
// pipeline's k-th, so convnet's BatchNorm gives that pipeline's weights.
// Control: without --sync-bn each replica normalises its half alone.
TEST(MeshCliTest, SyncBatchNormIsTheOneProcessPipelines) {
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
TEST(MeshCliTest, CheckpointsResumeUnderAnotherMesh) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  expect_resumes_as_uninterrupted(dir, model, kMesh,
                                  {"--nproc-per-node 0", "--nproc-per-node 2 --strategy pipeline",
                                   "--nproc-per-node 4"},
                                  "dp=2,pp=2");
  TempDir other;
  testing::write_synthetic_idx(other.path(), 1024, 64);
  expect_resumes_as_uninterrupted(other, model, "--nproc-per-node 4", {kMesh + " --shard-optimizer"}, "dp=4");
}

// FSDP x pipeline's checkpoints are plain SGD's over the whole model
// (Note [fsdp x pipeline checkpoints]): one written by it resumes in one
// process, as DDP x pipeline and as FSDP on 2 ranks, and one written by
// DDP x pipeline resumes as FSDP x pipeline, each ending where the
// uninterrupted run does.
TEST(MeshCliTest, FsdpTimesPipelineCheckpointsResumeAnywhere) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string fsdp = kMesh + " --strategy fsdp --fsdp-min-unit-params 0";
  expect_resumes_as_uninterrupted(dir, model, fsdp,
                                  {"--nproc-per-node 0", kMesh, "--nproc-per-node 2 --strategy fsdp"},
                                  "FSDP x pipeline");
  TempDir other;
  testing::write_synthetic_idx(other.path(), 1024, 64);
  expect_resumes_as_uninterrupted(other, model, kMesh, {fsdp + " --schedule interleaved"}, "DDP x pipeline");
}

// Evaluation and the epoch's figures come once, for the whole model: the
// same losses and accuracies as one process (each replica pipeline
// evaluating its dp rank's share of the 65 test images, 33 and 32), and the
// job's 4 ranks. Rank
// 0's traffic per step is the analytic figure (bench/mesh_traffic.py): over
// dp, DDP's all-reduce of stage 0's gradients (fc1: 200960 float64) and two
// int32 used-flags; over pp, 4 micro-batches of 4 rows of fc1's 256 float64
// outputs, each after an 80-byte header, sent forward, their gradients
// received, and the loss's broadcast.
TEST(MeshCliTest, MetricsAreOneProcesss) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 65);
  auto train = [&](const std::string& flags) {
    auto r = run_tandem("train --data idx:" + dir.path() + " --model mlp --dtype float64 --batch-size 32 "
                        "--max-steps 8 --epochs 1 --progress lines --metrics-out " + dir.file("m.jsonl") + " " +
                        flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return std::make_pair(testing::last_metrics(dir.file("m.jsonl")), r.output);
  };
  auto [one, one_output] = train("--nproc-per-node 0");
  auto [mesh, output] = train(kMesh + " --pipeline-split relu1");
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(mesh.is_null());
  EXPECT_NEAR(mesh["test_loss"].get<double>(), one["test_loss"].get<double>(), 1e-12);
  EXPECT_EQ(mesh["test_acc"].get<double>(), one["test_acc"].get<double>());
  EXPECT_NEAR(mesh["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-12);
  EXPECT_EQ(mesh["train_acc"].get<double>(), one["train_acc"].get<double>());
  EXPECT_EQ(mesh["world_size"].get<int64_t>(), 4);
  const auto& comm = mesh["comm_bytes_per_step"];
  EXPECT_EQ(comm["dp"]["all_reduce"].get<double>(), 200960 * 8 + 2 * 4) << comm.dump();
  EXPECT_EQ(comm["pp"]["send"].get<double>(), 4 * (80 + 4 * 256 * 8)) << comm.dump();
  EXPECT_EQ(comm["pp"]["recv"].get<double>(), 4 * (80 + 4 * 256 * 8)) << comm.dump();
  EXPECT_EQ(comm["pp"]["broadcast"].get<double>(), 8) << comm.dump();
  EXPECT_FALSE(one.contains("comm_bytes_per_step"));
  // FSDP x pipeline evaluates its shares with each stage gathered once: the same figures.
  auto [fsdp, fsdp_output] = train(kMesh + " --pipeline-split relu1 --strategy fsdp --fsdp-min-unit-params 0");
  ASSERT_FALSE(fsdp.is_null()) << fsdp_output;
  EXPECT_NEAR(fsdp["test_loss"].get<double>(), one["test_loss"].get<double>(), 1e-12);
  EXPECT_EQ(fsdp["test_acc"].get<double>(), one["test_acc"].get<double>());
  EXPECT_NE(output.find("device mesh pp=2,dp=2,tp=1 over 4 ranks: 2 pipeline(s) of 2 stages"), std::string::npos)
      << output;
  EXPECT_NE(output.find("4 x cpu (pipeline, a stage each, mesh pp=2,dp=2,tp=1) | 32           | 16"),
            std::string::npos)
      << output;
}

// A mesh the job cannot have is named before any worker starts (exit 2).
TEST(MeshCliTest, AMeshTheJobCannotHaveIsAUsageError) {
  const std::string train = "train --data idx:/nonexistent --model mlp --progress off ";
  struct Case {
    std::string flags, message;
  };
  for (const auto& c : std::vector<Case>{
           {"--nproc-per-node 4 --mesh dp=3", "--mesh dp=3: pp=1,dp=3,tp=1 is a mesh of 3 ranks, but the job has 4"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2,dp=2", "--mesh dp=2,pp=2,dp=2: dp given twice"},
           {"--nproc-per-node 4 --mesh dp=2,xp=2", "--mesh dp=2,xp=2: unknown dimension 'xp'"},
           {"--nproc-per-node 4 --mesh dp=2,pp=0", "--mesh dp=2,pp=0: pp expected a whole number of ranks"},
           {"--nproc-per-node 4 --mesh tp=2,dp=2", "tensor parallelism splits a language model's layers; mlp is an image"},
           {"--nproc-per-node 2 --mesh dp=2 --strategy pipeline", "--strategy pipeline needs pp > 1"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --grad-accum 2", "--grad-accum does not go with"},
           {"--nproc-per-node 1,2 --mesh dp=2", "lays out one number of ranks"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --batch-size 33",
            "--batch-size 33: not divisible by the 2 data-parallel rank(s) of --mesh pp=2,dp=2,tp=1"},
           {"--nproc-per-node 8 --mesh pp=8", "mlp has 6 layers, fewer than the 8 pieces of --mesh pp=8"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --pipeline-split fc1,fc2",
            "--pipeline-split fc1,fc2: 2 name(s) begin 3 pieces, but --mesh dp=2,pp=2 runs 2 stages"},
       }) {
    EXPECT_TRUE(testing::tandem_fails(train + c.flags, 2, c.message)) << c.flags;
  }
}

}  // namespace
}  // namespace tandem
