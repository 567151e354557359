// World-size invariance: the same seed and global batch on 1, 2 and 4 Gloo
// ranks give the same weights, with --sync-bn for a BatchNorm model, and for
// a model without BatchNorm; and so does each rank's batch passed in chunks
// (--grad-accum, DDP's no_sync), with and without gradient clipping; the
// optimizer sharded over the ranks (--shard-optimizer) gives the plain one's;
// and so do fully sharded data parallelism (--strategy fsdp) and a pipeline
// over ranks (--strategy pipeline --nproc-per-node N).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::run_tandem;
using testing::TempDir;
using testing::train_and_export;
using testing::expect_close_weights;
using testing::expect_same_weights;
using testing::resume_after_ten_steps;
using testing::expect_resumes_as_uninterrupted;

void expect_world_size_invariance(const std::string& model_flags, double tolerance,
                                  const std::string& control_flags = "") {
  expect_same_weights({"--nproc-per-node 1", "--nproc-per-node 2", "--nproc-per-node 4"}, model_flags,
                      tolerance, control_flags);
}

TEST(SyncBnCliTest, OneTwoAndFourRanksGiveTheSameWeights) {
  // Control: without --sync-bn each rank normalises by its own part of the batch.
  expect_world_size_invariance("--model convnet --sync-bn", 1e-2, "--model convnet");
}

TEST(SyncBnCliTest, AModelWithoutBatchNormIsInvariantToo) {
  expect_world_size_invariance("--model mlp", 1e-2);
}

TEST(SyncBnCliTest, InFloat64TheRanksAgreeToRounding) {
  // The bound (1e-5) holds here with seven orders of magnitude to spare.
  expect_world_size_invariance("--model convnet --sync-bn --dtype float64", 1e-12, "--model convnet --dtype float64");
  expect_world_size_invariance("--model mlp --dtype float64", 1e-12);
}

// --grad-accum over ranks: DDP (the first chunks' backwards under no_sync,
// the last one's all-reducing) and seed 004's all-reduce after backward give
// one process's weights, uneven chunks included; so does --clip-grad-norm,
// which every rank applies to the same averaged gradients (the control: the
// same runs without it).
TEST(GradAccumCliTest, ChunksOnSeveralRanksGiveOneProcesssWeights) {
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --grad-accum 2",
                       "--nproc-per-node 2 --grad-accum 3 --strategy allreduce",
                       "--nproc-per-node 4 --grad-accum 8"},
                      "--model mlp --dtype float64", 1e-12);
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2", "--nproc-per-node 2 --grad-accum 4"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12,
                      "--model mlp --dtype float64");
}

// Note [resuming on another world size]: 2 ranks stopped after 10 steps,
// then resumed in one process or on 4 ranks, end where 20 uninterrupted
// steps on 2 ranks do (float64: to rounding). A checkpoint whose global
// batch would change (--batch-per-process on another world size) is refused.
TEST(ResumeCliTest, ACheckpointResumesOnAnotherWorldSize) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  train_and_export(dir, model + "--nproc-per-node 2", "whole.safetensors");
  std::vector<std::pair<std::string, std::string>> resumed;
  for (const char* ranks : {"0", "4"}) {
    auto r = resume_after_ten_steps(dir, model, "--nproc-per-node 2", std::string("--nproc-per-node ") + ranks,
                                    std::string("ckpt-") + ranks, std::string("resumed-") + ranks + ".safetensors");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    std::string world = std::string(ranks) == "0" ? "1" : ranks;
    EXPECT_NE(r.output.find("the checkpoint was written by a run of 2 data-parallel rank(s); resuming on " + world),
              std::string::npos) << r.output;
    resumed.emplace_back(std::string("resumed-") + ranks + ".safetensors",
                         std::string("2 ranks, then ") + world);
  }
  expect_close_weights(dir, "whole.safetensors", resumed, 1e-12, "first-half.safetensors");

  EXPECT_TRUE(testing::tandem_fails(
      "train --data idx:" + dir.path() + " " + model +
          "--batch-per-process 16 --max-steps 20 --lr 0.05 --progress off --resume --checkpoint-dir " +
          dir.file("ckpt-4") + " --nproc-per-node 4",
      testing::kAnyFailure,
      "it was written by a run with other settings (batch=32 in the checkpoint, batch=64 in this run)"));
  // The CLI prints the message's further lines too: both fingerprints.
  EXPECT_TRUE(testing::tandem_fails(
      "train --data idx:" + dir.path() + " " + model +
          "--batch-size 64 --max-steps 20 --lr 0.05 --progress off --resume --checkpoint-dir " +
          dir.file("ckpt-4"),
      testing::kAnyFailure, "(the checkpoint's: model="));
}

// --shard-optimizer (Note [sharded optimizer state]): each rank steps its
// share of the parameters and broadcasts it, with the plain optimizer's
// arithmetic, so the weights are the unsharded run's bit for bit (tolerance
// 0, in float32), under ddp and allreduce, with --grad-accum, clipping and
// Nesterov. The control: another momentum.
TEST(ShardedOptimizerCliTest, TheWeightsAreThePlainOptimizersBitForBit) {
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
TEST(ActivationCheckpointCliTest, DdpGivesThePlainWeightsBitForBit) {
  expect_same_weights({"--nproc-per-node 2", "--nproc-per-node 2 --checkpoint-activations 3",
                       "--nproc-per-node 2 --checkpoint-activations 2 --shard-optimizer"},
                      "--model convnet", 0.0, "--model convnet --momentum 0.5");
}

// Its checkpoints hold the whole state, gathered from the ranks at every
// save (--checkpoint-every's and the last): 2 sharded ranks stopped at step
// 10 resume in one process without sharding, or sharded on 4 ranks, and end
// where 20 uninterrupted sharded steps do (float64: to rounding; a resumed
// run missing the momentum of some parameters would be 1e-3 or more away).
TEST(ShardedOptimizerCliTest, CheckpointsHoldTheWholeStateAndResumeEitherWay) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  expect_resumes_as_uninterrupted(dir, model, "--nproc-per-node 2 --shard-optimizer",
                                  {"--nproc-per-node 0", "--nproc-per-node 4 --shard-optimizer"}, "2 sharded ranks");
}

// --strategy fsdp (Note [fully sharded parameters]): 2 and 4 ranks, units
// of every size down to one layer each, ZeRO-3 and ZeRO-2, --grad-accum
// (each chunk's gradients reduce-scattered and summed into the shards) and
// --clip-grad-norm (the norm from every rank's shards) give one process's
// weights in float64 to rounding; with --sync-bn so does convnet, whose
// BatchNorm statistics are not sharded. Controls: another momentum, and
// convnet without --sync-bn.
TEST(FsdpCliTest, OneProcesssWeightsOnTwoAndFourRanks) {
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
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2" + fsdp + "0"},
                      "--model convnet --sync-bn --dtype float64", 1e-12, "--model convnet --dtype float64");
}

// Under bf16 autocast FSDP runs DDP's arithmetic: the same casts of the
// same parameters, and each gradient averaged as (a + b) / 2 over 2 ranks
// (halving is exact), so the weights are DDP's bit for bit; so do units
// recomputed in backward (under the forward's autocast).
TEST(FsdpCliTest, Bf16AutocastTrainsAsDdpBitForBit) {
  expect_same_weights({"--nproc-per-node 2", "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0",
                       "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0 --checkpoint-activations 1"},
                      "--model convnet --amp bf16", 0.0, "--model convnet --amp bf16 --momentum 0.5");
}

// Evaluation under FSDP gathers units in every forward, so the ranks must
// make as many: 65 test images over 2 ranks are 33 and 32, 3 and 2 batches
// of 16; rank 1 runs an empty one at the end (engine::evaluate) instead of
// leaving rank 0 in an all-gather until --dist-timeout. The loss and
// accuracy are one process's.
TEST(FsdpCliTest, UnevenEvaluationSplitsKeepTheRanksInStep) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 65);
  auto train = [&](const std::string& flags) {
    auto r = run_tandem("train --data idx:" + dir.path() + " --model mlp --dtype float64 --batch-size 32 "
                        "--max-steps 8 --epochs 1 --progress off --dist-timeout 30 --metrics-out " +
                        dir.file("m.jsonl") + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
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
// stopped at step 10 resume in one process without FSDP, or on 4 FSDP ranks
// with other units, and end where 20 uninterrupted FSDP steps do.
TEST(FsdpCliTest, CheckpointsResumeWithOrWithoutFsdp) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string fsdp = "--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0";
  expect_resumes_as_uninterrupted(dir, model, fsdp, {"--nproc-per-node 0", "--nproc-per-node 4 --strategy fsdp"},
                                  "2 FSDP ranks");
}

// --strategy pipeline over ranks (Note [pipeline over ranks]): 2 and 3
// ranks, one stage each, with GPipe, 1F1B and interleaved 1F1B, give one
// process's weights, with or without a pipeline, in float64 to rounding;
// so does --clip-grad-norm, its norm summed over the stages. convnet's
// BatchNorm normalises each micro-batch alone, so it is held to the
// one-process pipeline. Controls: another momentum; no clipping; 8
// micro-batches instead of 4.
TEST(PipelineRanksCliTest, OneProcesssWeightsOverTwoAndThreeRanks) {
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
// save: 2 pipeline ranks stopped at step 10 resume in one process without a
// pipeline, or interleaved on 2 ranks, and end where 20 uninterrupted steps
// on 2 pipeline ranks do. Evaluation comes from the last stage: the test
// loss and accuracy are one process's.
TEST(PipelineRanksCliTest, CheckpointsAndEvaluationAreOneProcesss) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  const std::string model = "--model mlp --dtype float64 ";
  const std::string ranks = "--nproc-per-node 2 --strategy pipeline";
  expect_resumes_as_uninterrupted(dir, model, ranks, {"--nproc-per-node 0", ranks + " --schedule interleaved"},
                                  "2 pipeline ranks");

  auto train = [&](const std::string& flags) {
    auto r = run_tandem("train --data idx:" + dir.path() + " " + model + "--batch-size 32 --max-steps 8 "
                        "--epochs 1 --progress off --metrics-out " + dir.file("m.jsonl") + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
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

// --skip-bad-images leaves the ranks' batches of different sizes. Note
// [unequal batches]: each rank's loss is weighted by its share of the global
// batch, so 2 ranks still give one process's weights (in float64, to
// rounding; unweighted, 3e-2), the epoch's images are counted over the ranks
// (train accuracy never above 100%), and every rank reports the images it
// left out, as `tandem eval` does. The pipeline over ranks cuts a batch
// shorter than --micro-batches into one micro-batch per row.
TEST(SkipBadImagesCliTest, RanksOfUnequalBatchesAreOneProcess) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("images"), 2, 20, 20);
  std::vector<std::string> bad;
  for (const char* name : {"c0/img001.png", "c0/img004.jpg", "c0/img005.png", "c0/img008.jpg", "c1/img002.jpg",
                           "c1/img003.png", "c1/img010.jpg", "c1/img013.png", "c1/img016.jpg"}) {
    bad.push_back(dir.file("images/") + name);
    std::filesystem::resize_file(bad.back(), 0);
  }
  const std::string data = "--data imagefolder:" + dir.file("images") +
                           " --image-size 16 --augment none --model mlp --dtype float64 --skip-bad-images ";
  auto train = [&](const std::string& flags, const std::string& name) {
    auto r = run_tandem("train " + data + "--batch-size 8 --epochs 2 --lr 0.05 --progress off --export-weights " +
                        dir.file(name + ".safetensors") + " --metrics-out " + dir.file(name + ".jsonl") + " " +
                        flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    for (const auto& path : bad) {
      EXPECT_NE(r.output.find("tandem: warning: skipped " + path + ": "), std::string::npos)
          << flags << ": " << path << " not reported:\n" << r.output;
    }
    return testing::last_metrics(dir.file(name + ".jsonl"));
  };
  auto one = train("--nproc-per-node 0", "one");
  auto two = train("--nproc-per-node 2", "two");
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(two.is_null());
  EXPECT_NEAR(two["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-9);
  EXPECT_NEAR(two["train_acc"].get<double>(), one["train_acc"].get<double>(), 1e-9);
  EXPECT_LE(two["train_acc"].get<double>(), 1.0);
  expect_close_weights(dir, "one.safetensors", {{"two.safetensors", "2 ranks, unequal batches"}}, 1e-12);

  auto pipeline = train("--nproc-per-node 2 --strategy pipeline --micro-batches 8", "stages");
  EXPECT_NEAR(pipeline["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-9);
  expect_close_weights(dir, "one.safetensors", {{"stages.safetensors", "2 pipeline ranks"}}, 1e-12);

  auto r = run_tandem("launch --nproc-per-node 2 -- " TANDEM_CLI " eval " + data + "--val-data imagefolder:" +
                      dir.file("images") + " --weights " + dir.file("one.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& path : bad) {
    EXPECT_NE(r.output.find("tandem: warning: skipped " + path + ": "), std::string::npos)
        << "eval: " << path << " not reported:\n" << r.output;
  }
}

}  // namespace
}  // namespace tandem
