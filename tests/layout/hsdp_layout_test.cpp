// HSDP, --mesh dp_replicate=R,dp_shard=S --strategy fsdp (Note [hsdp]), the
// ranks as threads: FSDP over each group of S dp ranks, the groups'
// gradients averaged, trains one process's weights in float64, alone, with
// clipping and under a pipeline (with tp and sp: the generated matrix,
// matrix_layout_test.cpp); its
// checkpoints (written by replica group 0) resume under another layout,
// and FSDP's resume under it. Each with a control that must fail.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace hsdp_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

constexpr testing::RunStyle kRuns{/*threads=*/true, /*steps=*/6};
const std::string kHsdp = "--nproc-per-node 4 --mesh dp_replicate=2,dp_shard=2 --strategy fsdp";

// mlp with SGD and momentum: one process given dp_shard=1 (as dp=1), HSDP
// on 2 x 2 (each layer a unit), 4 x 1
// (FSDP over one rank: the replicas' all-reduce alone), 1 x 4 (FSDP over
// all: the replicas' group of one) and under pp=2 on 8 ranks (control:
// another momentum); with clipping, the shards counted on replica group 0
// only (control: no clipping).
TEST(HsdpLayoutTest, HsdpIsOneProcess) {
  const std::string model = "--model mlp --dtype float64 ";
  testing::expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 0 --mesh dp_shard=1 --strategy fsdp",
                                kHsdp + " --fsdp-min-unit-params 0",
                                "--nproc-per-node 4 --mesh dp_replicate=4 --strategy fsdp",
                                "--nproc-per-node 4 --mesh dp_shard=4 --strategy fsdp",
                                "--nproc-per-node 8 --mesh pp=2,dp_replicate=2,dp_shard=2 --strategy fsdp"},
                               model, 1e-12, model + " --momentum 0.5", kRuns);
  testing::expect_same_weights({"--nproc-per-node 0", kHsdp}, model + "--clip-grad-norm 0.02", 1e-12, model, kRuns);
}

// HSDP's sharded checkpoint (replica group 0's shards) resumes in one
// process and as FSDP over 4 ranks; FSDP's over 4 ranks resumes as HSDP.
// Each ends where the uninterrupted run does.
TEST(HsdpLayoutTest, CheckpointsResumeUnderAnotherLayout) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  testing::expect_resumes_as_uninterrupted(dir, model, kHsdp,
                                           {"--nproc-per-node 0", "--nproc-per-node 4 --strategy fsdp"}, "HSDP",
                                           1e-12, kRuns);
  TempDir other;
  testing::write_synthetic_idx(other.path(), 1024, 64);
  testing::expect_resumes_as_uninterrupted(other, model, "--nproc-per-node 4 --strategy fsdp", {kHsdp}, "FSDP",
                                           1e-12, kRuns);
}

}  // namespace hsdp_layout
}  // namespace tandem
