// World-size invariance, the ranks as threads: the same seed and global
// batch on 1, 2 and 4 Gloo ranks give the same weights, with --sync-bn for
// a BatchNorm model, and for a model without BatchNorm; and so does each
// rank's batch passed in chunks (--grad-accum, DDP's no_sync), with and
// without gradient clipping; the optimizer sharded over the ranks
// (--shard-optimizer) gives the plain one's; and so do fully sharded data
// parallelism (--strategy fsdp) and a pipeline over ranks (--strategy
// pipeline --nproc-per-node N). Checkpoints of each resume on another
// world size or layout. Runs of 8 steps (a resumed one stops at 4): every
// layout's arithmetic is exact from the first step, and a wrong scale or a
// missing reduction shows as 1e-3 or more by then.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace data_parallel_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

constexpr testing::RunStyle kRuns{/*threads=*/true, /*steps=*/8};

void export_run(const TempDir& dir, const std::string& flags, const std::string& name) {
  testing::train_and_export(dir, flags, name, kRuns);
}
void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags, double tolerance,
                         const std::string& control_flags = "") {
  testing::expect_same_weights(runs, model_flags, tolerance, control_flags, kRuns);
}
void expect_resumes(const TempDir& dir, const std::string& model, const std::string& run,
                                     const std::vector<std::string>& hows, const std::string& label) {
  testing::expect_resumes_as_uninterrupted(dir, model, run, hows, label, 1e-12, kRuns);
}
using testing::expect_close_weights;

void expect_world_size_invariance(const std::string& model_flags, double tolerance,
                                  const std::string& control_flags = "") {
  expect_same_weights({"--nproc-per-node 1", "--nproc-per-node 2", "--nproc-per-node 4"}, model_flags,
                      tolerance, control_flags);
}

TEST(SyncBnLayoutTest, OneTwoAndFourRanksGiveTheSameWeights) {
  // Control: without --sync-bn each rank normalises by its own part of the batch.
  expect_world_size_invariance("--model convnet --sync-bn", 1e-2, "--model convnet");
}

TEST(SyncBnLayoutTest, AModelWithoutBatchNormIsInvariantToo) {
  expect_world_size_invariance("--model mlp", 1e-2);
}

TEST(SyncBnLayoutTest, InFloat64TheRanksAgreeToRounding) {
  // The bound (1e-5) holds here with seven orders of magnitude to spare.
  expect_world_size_invariance("--model convnet --sync-bn --dtype float64", 1e-12, "--model convnet --dtype float64");
  expect_world_size_invariance("--model mlp --dtype float64", 1e-12);
}

// --grad-accum over ranks: DDP (the first chunks' backwards under no_sync,
// the last one's all-reducing) and seed 004's all-reduce after backward give
// one process's weights, uneven chunks included; so does --clip-grad-norm,
// which every rank applies to the same averaged gradients (the control: the
// same runs without it).
TEST(GradAccumLayoutTest, ChunksOnSeveralRanksGiveOneProcesssWeights) {
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --grad-accum 2",
                       "--nproc-per-node 2 --grad-accum 3 --strategy allreduce",
                       "--nproc-per-node 4 --grad-accum 8"},
                      "--model mlp --dtype float64", 1e-12);
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2", "--nproc-per-node 2 --grad-accum 4"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12,
                      "--model mlp --dtype float64");
}

// Note [resuming on another world size]: 2 ranks stopped halfway, then
// resumed in one process or on 4 ranks, end where the uninterrupted run
// on 2 ranks does (float64: to rounding). A checkpoint whose global
// batch would change (--batch-per-process on another world size) is refused.
TEST(ResumeLayoutTest, ACheckpointResumesOnAnotherWorldSize) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  export_run(dir, model + "--nproc-per-node 2", "whole.safetensors");
  std::vector<std::pair<std::string, std::string>> resumed;
  for (const char* ranks : {"0", "4"}) {
    auto r = testing::resume_halfway(dir, model, "--nproc-per-node 2", std::string("--nproc-per-node ") + ranks,
                                     std::string("ckpt-") + ranks, std::string("resumed-") + ranks + ".safetensors",
                                     kRuns);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string world = std::string(ranks) == "0" ? "1" : ranks;
    EXPECT_NE(r.output.find("the checkpoint was written by a run of 2 data-parallel rank(s); resuming on " + world),
              std::string::npos) << r.output;
    resumed.emplace_back(std::string("resumed-") + ranks + ".safetensors",
                         std::string("2 ranks, then ") + world);
  }
  expect_close_weights(dir, "whole.safetensors", resumed, 1e-12, "first-half.safetensors");

  // Both fingerprints are in the message (the CLI prints its further lines).
  for (const auto& [flags, expected] : std::vector<std::pair<std::string, std::string>>{
           {"--batch-per-process 16 --nproc-per-node 4",
            "it was written by a run with other settings (batch=32 in the checkpoint, batch=64 in this run)"},
           {"--batch-size 64", "(the checkpoint's: model="}}) {
    const auto job = testing::train_in_threads("--data idx:" + dir.path() + " " + model + flags +
                                               " --max-steps 8 --lr 0.05 --progress off --resume --checkpoint-dir " +
                                               dir.file("ckpt-4"));
    ASSERT_FALSE(job.ok()) << flags;
    EXPECT_NE(job.errors[0].find(expected), std::string::npos) << flags << ":\n" << job.report();
  }
}

// --shard-optimizer (Note [sharded optimizer state]): each rank steps its
// share of the parameters and broadcasts it, with the plain optimizer's
// arithmetic, so the weights are the unsharded run's bit for bit (tolerance
// 0, in float32), under ddp and allreduce, with --grad-accum, clipping and
// Nesterov. The control: another momentum.
TEST(ShardedOptimizerLayoutTest, TheWeightsAreThePlainOptimizersBitForBit) {
  expect_same_weights({"--nproc-per-node 2", "--nproc-per-node 2 --shard-optimizer"}, "--model convnet", 0.0,
                      "--model convnet --momentum 0.5");
  for (const std::string strategy : {"ddp", "allreduce"}) {  // which round differently from each other
    const std::string ranks = "--nproc-per-node 4 --grad-accum 2 --strategy " + strategy;
    expect_same_weights({ranks, ranks + " --shard-optimizer"}, "--model mlp --nesterov --clip-grad-norm 0.05", 0.0);
  }
}

// --checkpoint-activations under DDP on 2 ranks (gradients arriving from a
// backward inside the backward), also with the sharded optimizer: the plain
// run's weights bit for bit.
TEST(ActivationCheckpointLayoutTest, DdpGivesThePlainWeightsBitForBit) {
  expect_same_weights({"--nproc-per-node 2", "--nproc-per-node 2 --checkpoint-activations 3",
                       "--nproc-per-node 2 --checkpoint-activations 2 --shard-optimizer"},
                      "--model convnet", 0.0, "--model convnet --momentum 0.5");
}

// Its checkpoints hold the whole state, gathered from the ranks at every
// save (--checkpoint-every's and the last): 2 sharded ranks stopped halfway
// resume in one process without sharding, or sharded on 4 ranks, and end
// where the uninterrupted sharded run does (float64: to rounding; a resumed
// run missing the momentum of some parameters would be 1e-3 or more away).
TEST(ShardedOptimizerLayoutTest, CheckpointsHoldTheWholeStateAndResumeEitherWay) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  expect_resumes(dir, model, "--nproc-per-node 2 --shard-optimizer",
                                  {"--nproc-per-node 0", "--nproc-per-node 4 --shard-optimizer"}, "2 sharded ranks");
}

// --strategy fsdp (Note [fully sharded parameters]): 2 and 4 ranks, units
// of every size down to one layer each, ZeRO-3 and ZeRO-2, --grad-accum
// (each chunk's gradients reduce-scattered and summed into the shards) and
// --clip-grad-norm (the norm from every rank's shards) give one process's
// weights in float64 to rounding; with --sync-bn so does convnet, whose
// BatchNorm statistics are not sharded. Controls: another momentum, and
// convnet without --sync-bn.
TEST(FsdpLayoutTest, OneProcesssWeightsOnTwoAndFourRanks) {
  const std::string fsdp = " --strategy fsdp --fsdp-min-unit-params ";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2" + fsdp + "100000",
                       "--nproc-per-node 4" + fsdp + "0 --fsdp-sharding grad-op",
                       "--nproc-per-node 2" + fsdp + "0 --grad-accum 3",
                       "--nproc-per-node 2" + fsdp + "0 --checkpoint-activations 1",
                       "--nproc-per-node 1" + fsdp + "0"},
                      "--model mlp --dtype float64", 1e-12, "--model mlp --dtype float64 --momentum 0.5");
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2" + fsdp + "0",
                       "--nproc-per-node 4" + fsdp + "1000 --grad-accum 2"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12, "--model mlp --dtype float64");
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2" + fsdp + "0",
                       "--nproc-per-node 2 --channels-last" + fsdp + "0"},
                      "--model convnet --sync-bn --dtype float64", 1e-12, "--model convnet --dtype float64");
}

// --channels-last under FSDP: the convolutions' weights are NHWC when FSDP
// takes them, their shards keep that order (dim 0 outermost), and the
// account does not say there are none (it counted FSDP's empty parameters
// once). The control: mlp, which has none.
TEST(FsdpLayoutTest, ChannelsLastIsNotReportedAsDoingNothing) {
  const std::string warning = "--channels-last: convnet has no 4-D weights";
  auto job = testing::train_in_threads("--model convnet --nproc-per-node 2 --strategy fsdp --channels-last "
                                       "--max-steps 1 --epochs 1 --progress lines");
  ASSERT_TRUE(job.ok()) << job.report();
  EXPECT_EQ(job.log.find(warning), std::string::npos) << job.log;
  auto control = testing::train_in_threads("--model mlp --nproc-per-node 2 --strategy fsdp --channels-last "
                                           "--max-steps 1 --epochs 1 --progress lines");
  ASSERT_TRUE(control.ok()) << control.report();
  EXPECT_NE(control.log.find("--channels-last: mlp has no 4-D weights"), std::string::npos) << control.log;
}

// Under bf16 autocast FSDP runs DDP's arithmetic: the same casts of the
// same parameters, and each gradient averaged as (a + b) / 2 over 2 ranks
// (halving is exact), so the weights are DDP's bit for bit; so do units
// recomputed in backward (under the forward's autocast).
TEST(FsdpLayoutTest, Bf16AutocastTrainsAsDdpBitForBit) {
  expect_same_weights({"--nproc-per-node 2", "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0",
                       "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0 --checkpoint-activations 1"},
                      "--model convnet --amp bf16", 0.0, "--model convnet --amp bf16 --momentum 0.5");
}

// Evaluation under FSDP gathers units in every forward, so the ranks must
// make as many: 65 test images over 2 ranks are 33 and 32, 3 and 2 batches
// of 16; rank 1 runs an empty one at the end (engine::evaluate) instead of
// leaving rank 0 in an all-gather until --dist-timeout. The loss and
// accuracy are one process's.
TEST(FsdpLayoutTest, UnevenEvaluationSplitsKeepTheRanksInStep) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 65);
  auto train = [&](const std::string& flags) {
    const auto job = testing::train_in_threads("--data idx:" + dir.path() + " --model mlp --dtype float64 "
                                               "--batch-size 32 --max-steps 8 --epochs 1 --progress off "
                                               "--dist-timeout 30 --metrics-out " + dir.file("m.jsonl") + " " + flags);
    EXPECT_TRUE(job.ok()) << job.report();
    return testing::last_metrics(dir.file("m.jsonl"));
  };
  auto one = train("--nproc-per-node 0");
  auto fsdp = train("--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0");
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(fsdp.is_null());
  EXPECT_NEAR(fsdp["test_loss"].get<double>(), one["test_loss"].get<double>(), 1e-12);
  EXPECT_EQ(fsdp["test_acc"].get<double>(), one["test_acc"].get<double>());
}

// Its checkpoints are plain ones (Note [fsdp optimizer state]): 2 FSDP ranks
// stopped halfway resume in one process without FSDP, or on 4 FSDP ranks
// with other units, and end where the uninterrupted FSDP run does.
TEST(FsdpLayoutTest, CheckpointsResumeWithOrWithoutFsdp) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string fsdp = "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0";
  expect_resumes(dir, model, fsdp, {"--nproc-per-node 0", "--nproc-per-node 4 --strategy fsdp"},
                                  "2 FSDP ranks");
}

// --strategy pipeline over ranks (Note [pipeline over ranks]): 2 and 3
// ranks, one stage each, with GPipe, 1F1B and interleaved 1F1B, give one
// process's weights, with or without a pipeline, in float64 to rounding;
// so does --clip-grad-norm, its norm summed over the stages. convnet's
// BatchNorm normalises each micro-batch alone, so it is held to the
// one-process pipeline. Controls: another momentum; no clipping; 8
// micro-batches instead of 4.
TEST(PipelineRanksLayoutTest, OneProcesssWeightsOverTwoAndThreeRanks) {
  const std::string ranks = " --strategy pipeline";
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 0 --devices cpu,cpu" + ranks,
                       "--nproc-per-node 2" + ranks, "--nproc-per-node 2 --schedule interleaved" + ranks,
                       "--nproc-per-node 3 --schedule gpipe --micro-batches 3 --pipeline-balance params" + ranks},
                      "--model mlp --dtype float64", 1e-12, "--model mlp --dtype float64 --momentum 0.5");
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2" + ranks},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12, "--model mlp --dtype float64");
  expect_same_weights({"--nproc-per-node 0 --devices cpu,cpu" + ranks, "--nproc-per-node 2" + ranks,
                       "--nproc-per-node 2 --virtual-stages 2 --schedule interleaved" + ranks},
                      "--model convnet --dtype float64", 1e-12,
                      "--model convnet --dtype float64 --strategy pipeline --micro-batches 8");
}

// Its checkpoints hold every stage's weights and momentum, gathered at each
// save: 2 pipeline ranks stopped halfway resume in one process without a
// pipeline, or interleaved on 2 ranks, and end where the uninterrupted run
// on 2 pipeline ranks does. Evaluation comes from the last stage: the test
// loss and accuracy are one process's.
TEST(PipelineRanksLayoutTest, CheckpointsAndEvaluationAreOneProcesss) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string ranks = "--nproc-per-node 2 --strategy pipeline";
  expect_resumes(dir, model, ranks, {"--nproc-per-node 0", ranks + " --schedule interleaved"},
                                  "2 pipeline ranks");

  auto train = [&](const std::string& flags) {
    const auto job = testing::train_in_threads("--data idx:" + dir.path() + " " + model + "--batch-size 32 "
                                               "--max-steps 8 --epochs 1 --progress off --metrics-out " +
                                               dir.file("m.jsonl") + " " + flags);
    EXPECT_TRUE(job.ok()) << job.report();
    return testing::last_metrics(dir.file("m.jsonl"));
  };
  auto one = train("--nproc-per-node 0");
  auto stages = train(ranks);
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(stages.is_null());
  EXPECT_NEAR(stages["test_loss"].get<double>(), one["test_loss"].get<double>(), 1e-12);
  EXPECT_EQ(stages["test_acc"].get<double>(), one["test_acc"].get<double>());
  EXPECT_NEAR(stages["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-12);
  EXPECT_EQ(stages["train_acc"].get<double>(), one["train_acc"].get<double>());
  EXPECT_EQ(stages["world_size"].get<int64_t>(), 2);
}

// Note [a failed write leaves nothing]: a sharded checkpoint that the
// disk cannot hold (a 2 MiB tmpfs holds one of mlp's, 1.6 MB of weights
// and momentum, not two) fails the job naming the disk, and leaves no
// half-written checkpoint-N.tmp-PID folder behind; the one before it stays.
TEST(ShardedCheckpointLayoutTest, AFullDiskLeavesNoPartialCheckpoint) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 16);
  ::mkdir(dir.file("ckpt").c_str(), 0755);
  testing::TmpfsMount small(dir.file("ckpt"), "size=2m");
  ASSERT_TRUE(small.ok) << "this test mounts a small tmpfs and needs root: " << small.output;
  const auto job = testing::train_in_threads("--nproc-per-node 2 --data idx:" + dir.path() +
                                             " --model mlp --batch-size 32 --max-steps 6 --progress off "
                                             "--dist-timeout 10 --checkpoint-every 2 --checkpoint-format sharded "
                                             "--checkpoint-dir " + dir.file("ckpt"));
  ASSERT_FALSE(job.ok());
  EXPECT_NE(job.report().find("No space left on device"), std::string::npos) << job.report();
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir.file("ckpt"))) {
    left.push_back(entry.path().filename().string());
  }
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{".tandem-lock", "checkpoint-00000002"}));
}

}  // namespace data_parallel_layout
}  // namespace tandem
