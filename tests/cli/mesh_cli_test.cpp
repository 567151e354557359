// --mesh through the CLI: the job's ranks as pipeline stages x
// data-parallel replicas (Note [replicated stages] in
// engine/parallel_layout.h); its evaluation, metrics and traffic are one
// process's, and a mesh the job cannot have is a usage error naming
// --mesh. Every composition's weights and checkpoints against one process
// are tests/layout/mesh_layout_test.cpp's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

const std::string kMesh = "--nproc-per-node 4 --mesh dp=2,pp=2";

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
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --grad-accum 2", "--grad-accum does not go with a pipeline (--mesh dp=2,pp=2)"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --strategy fsdp --grad-accum 2",
            "--grad-accum does not go with a pipeline (--mesh dp=2,pp=2)"},
           {"--nproc-per-node 1,2 --mesh dp=2", "lays out one number of ranks"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --batch-size 33",
            "--batch-size 33: not divisible by the 2 data-parallel rank(s) of --mesh pp=2,dp=2,tp=1"},
           {"--nproc-per-node 8 --mesh pp=8", "mlp has 6 layers, fewer than the 8 pieces of --mesh pp=8"},
           {"--nproc-per-node 4 --mesh dp_replicate=2,dp_shard=2",
            "dp_replicate and dp_shard lay out HSDP (FSDP over each group of dp_shard ranks, replicated over "
            "dp_replicate groups); give --strategy fsdp, or dp=4 for --strategy auto"},
           {"--nproc-per-node 4 --mesh pp=2,dp_shard=2 --strategy pipeline", "HSDP (FSDP over each group of dp_shard "
            "ranks, replicated over dp_replicate groups); give --strategy fsdp\n"},
           {"--nproc-per-node 4 --mesh dp=2,dp_shard=2 --strategy fsdp", "dp with dp_replicate or dp_shard"},
           {"--nproc-per-node 4 --mesh dp=2,pp=2 --pipeline-split fc1,fc2",
            "--pipeline-split fc1,fc2: 2 name(s) begin 3 pieces, but --mesh dp=2,pp=2 runs 2 stages"},
       }) {
    EXPECT_TRUE(testing::tandem_fails(train + c.flags, 2, c.message)) << c.flags;
  }
}

}  // namespace
}  // namespace tandem
