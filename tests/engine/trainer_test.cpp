// The Trainer's runs against their references: learning, seeds, resume,
// mixed precision, memory formats, accumulation, recomputation, sharding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <tuple>
#include <iterator>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>
#include <torch/cuda.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/trainer.h"
#include "tandem/observe/metrics.h"
#include "tandem/observe/profile.h"
#include "tandem/util/check.h"
#include "testing.h"

#include "trainer_fixture.h"

namespace tandem::engine {
namespace {

using testing::TempDir;

TEST_F(TrainerTest, LearnsTheSyntheticTask) {
  auto o = small_run(data_.path());
  Trainer trainer(o, nullptr);
  auto result = trainer.run();
  ASSERT_EQ(result.epochs.size(), 2u);
  EXPECT_EQ(result.steps, 16);
  EXPECT_GT(result.epochs.back().test_acc, 0.9);
  EXPECT_LT(result.epochs.back().train_loss, result.epochs.front().train_loss);
}

TEST_F(TrainerTest, SameSeedSameWeightsOtherSeedOtherWeights) {
  auto o = small_run(data_.path());
  o.workers = 2;  // threads must not change the result
  Trainer a(o, nullptr);
  a.run();
  o.workers = 0;
  Trainer b(o, nullptr);
  b.run();
  expect_equal_states(state_of(a), state_of(b));
  o.seed = 12;
  Trainer c(o, nullptr);
  c.run();
  EXPECT_FALSE(torch::equal(state_of(a)[0].second, state_of(c)[0].second));
}

// Stopped mid-epoch by --max-steps, then resumed: the same final weights as
// an uninterrupted run (momentum buffers, schedule, data order all restored).
TEST_F(TrainerTest, ResumedRunEqualsUninterruptedRun) {
  auto o = small_run(data_.path());
  Trainer whole(o, nullptr);
  auto whole_result = whole.run();

  TempDir checkpoints;
  o.checkpoint_dir = checkpoints.path();
  o.max_steps = 11;  // epoch 2, batch 3 of 8
  Trainer first(o, nullptr);
  auto partial = first.run();
  EXPECT_EQ(partial.steps, 11);
  EXPECT_TRUE(partial.epochs.back().partial);
  EXPECT_TRUE(std::filesystem::exists(checkpoints.file("checkpoint-00000011.pt")));

  o.max_steps = 0;
  o.resume = true;
  Trainer second(o, nullptr);
  auto rest = second.run();
  EXPECT_EQ(rest.steps, 16);
  ASSERT_EQ(rest.epochs.size(), 1u);
  EXPECT_EQ(rest.epochs[0].epoch, 2);
  expect_equal_states(state_of(whole), state_of(second));
  // The epoch's training loss covers the batches before and after the stop.
  EXPECT_NEAR(rest.epochs[0].train_loss, whole_result.epochs[1].train_loss, 1e-9);
  EXPECT_EQ(rest.epochs[0].test_acc, whole_result.epochs[1].test_acc);
}

// Mixed precision on the CPU: bf16 autocast learns the task; fp16 with its
// loss scaler, stopped and resumed, ends with the uninterrupted run's
// weights, so the scaler's state (scale, clean-step count) is in the
// checkpoint.
TEST_F(TrainerTest, MixedPrecisionLearnsAndResumesExactly) {
  auto o = small_run(data_.path());
  o.amp = AmpMode::kBf16;
  Trainer bf16(o, nullptr);
  EXPECT_GT(bf16.run().epochs.back().test_acc, 0.9);

  o.amp = AmpMode::kFp16;
  Trainer whole(o, nullptr);
  EXPECT_GT(whole.run().epochs.back().test_acc, 0.9);
  TempDir checkpoints;
  o.checkpoint_dir = checkpoints.path();
  o.max_steps = 11;
  Trainer first(o, nullptr);
  first.run();
  o.max_steps = 0;
  o.resume = true;
  Trainer second(o, nullptr);
  second.run();
  expect_equal_states(state_of(whole), state_of(second));
}

// --channels-last: the convolution weights are NHWC, and training ends
// where the default memory order does (to rounding: other kernels).
TEST_F(TrainerTest, ChannelsLastTrainsLikeTheDefaultOrder) {
  auto o = small_run(data_.path());
  o.epochs = 1;
  Trainer plain(o, nullptr);
  plain.run();
  o.channels_last = true;
  Trainer nhwc(o, nullptr);
  auto weight = nhwc.model()->named_parameters()["conv2.weight"];  // conv1 has one input channel: both orders coincide
  EXPECT_TRUE(weight.is_contiguous(torch::MemoryFormat::ChannelsLast));
  EXPECT_FALSE(weight.is_contiguous());
  auto result = nhwc.run();
  EXPECT_GT(result.epochs.back().test_acc, 0.8);
  for (const auto& p : plain.model()->named_parameters()) {
    auto other = nhwc.model()->named_parameters()[p.key()];
    EXPECT_TRUE(torch::allclose(p.value(), other, 1e-3, 1e-4)) << p.key();
  }
  o.channels_last = false;
  o.cudnn_benchmark = true;
  try {
    Trainer cpu(o, nullptr);
    FAIL() << "--cudnn-benchmark accepted on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cudnn-benchmark needs --device cuda"), std::string::npos) << e.what();
  }
}

// The largest relative difference (2-norms) between two states' tensors.
double worst_relative_difference(const std::vector<std::pair<std::string, torch::Tensor>>& a,
                                 const std::vector<std::pair<std::string, torch::Tensor>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!a[i].second.is_floating_point()) continue;
    auto difference = (a[i].second - b[i].second).norm().item<double>();
    worst = std::max(worst, difference / (a[i].second.norm().item<double>() + 1e-30));
  }
  return worst;
}

// --grad-accum K: each batch in K chunks (even or not), one step: the weights
// of the whole batch's step, to rounding (float64, a model without
// BatchNorm), also through DataParallel. A run that took a step per chunk,
// or summed the chunks' mean losses, would be 1e-3 or more away.
TEST_F(TrainerTest, GradientAccumulationGivesTheWholeBatchsWeights) {
  auto o = small_run(data_.path());
  o.model = "mlp";
  o.dtype = Dtype::kFloat64;
  o.epochs = 1;
  o.max_steps = 6;
  Trainer whole(o, nullptr);
  auto whole_result = whole.run();
  for (int64_t k : {2, 3, 64}) {
    for (Strategy strategy : {Strategy::kAuto, Strategy::kDp}) {
      auto chunked_options = o;
      chunked_options.grad_accum = k;
      chunked_options.strategy = strategy;
      if (chunked_options.strategy == Strategy::kDp) chunked_options.devices = "cpu,cpu";
      Trainer chunked(chunked_options, nullptr);
      auto result = chunked.run();
      std::string what = "--grad-accum " + std::to_string(k) + " --strategy " + strategy_name(strategy);
      EXPECT_LT(worst_relative_difference(state_of(whole), state_of(chunked)), 1e-12) << what;
      EXPECT_NEAR(result.epochs[0].train_loss, whole_result.epochs[0].train_loss, 1e-12) << what;
      EXPECT_EQ(result.epochs[0].train_acc, whole_result.epochs[0].train_acc) << what;
    }
  }
  // The control: four times the steps on a quarter of the batch.
  auto control_options = o;
  control_options.batch_size = 16;
  control_options.max_steps = 24;
  Trainer control(control_options, nullptr);
  control.run();
  EXPECT_GT(worst_relative_difference(state_of(whole), state_of(control)), 1e-3);

  auto bad = o;
  bad.grad_accum = 65;
  refused(bad, "--grad-accum 65: more chunks than the 64 samples each rank takes a step");
  bad.grad_accum = 0;
  refused(bad, "--grad-accum: expected a positive integer, got 0");
  bad.grad_accum = 2;
  bad.strategy = Strategy::kPipeline;
  bad.devices = "cpu,cpu";
  refused(bad, "--grad-accum does not go with a pipeline (--strategy pipeline)");
}

// --checkpoint-activations N: the same run bit for bit (the recomputed
// segments do the same arithmetic, and BatchNorm's statistics are updated
// once), plainly, through DataParallel, with --grad-accum, under --amp bf16
// and in pipelines; refused by name where it cannot work.
TEST_F(TrainerTest, CheckpointedActivationsGiveTheSameRun) {
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 4;
  o.dtype = Dtype::kFloat64;
  for (Strategy strategy : {Strategy::kAuto, Strategy::kDp}) {
    for (int64_t accum : {1, 2}) {
      auto plain_options = o;
      plain_options.strategy = strategy;
      if (plain_options.strategy == Strategy::kDp) plain_options.devices = "cpu,cpu";
      plain_options.grad_accum = accum;
      auto checkpointed_options = plain_options;
      checkpointed_options.checkpoint_activations = 3;
      Trainer plain(plain_options, nullptr), checkpointed(checkpointed_options, nullptr);
      auto a = plain.run(), b = checkpointed.run();
      SCOPED_TRACE(std::string("--strategy ") + strategy_name(strategy) + " --grad-accum " + std::to_string(accum));
      expect_equal_states(state_of(plain), state_of(checkpointed));
      EXPECT_EQ(a.epochs.back().train_loss, b.epochs.back().train_loss);
    }
  }
  {  // under bf16 autocast (float32 parameters): the recomputation autocasts as the forward did
    auto plain_options = o;
    plain_options.dtype = Dtype::kFloat32;
    plain_options.amp = AmpMode::kBf16;
    auto checkpointed_options = plain_options;
    checkpointed_options.checkpoint_activations = 3;
    Trainer plain(plain_options, nullptr), checkpointed(checkpointed_options, nullptr);
    plain.run();
    checkpointed.run();
    SCOPED_TRACE("--amp bf16");
    expect_equal_states(state_of(plain), state_of(checkpointed));
  }
  auto bad = o;
  bad.checkpoint_activations = 13;
  refused(bad, "--checkpoint-activations 13: convnet has 12 top-level layers to cut into segments");
  bad.checkpoint_activations = -1;
  refused(bad, "--checkpoint-activations: expected a number of segments >= 0 (0: off), got -1");
  bad.checkpoint_activations = 2;
  bad.sync_bn = true;
  refused(bad, "--checkpoint-activations does not go with --sync-bn");
  bad.sync_bn = false;
  bad.strategy = Strategy::kPipeline;
  bad.devices = "cpu,cpu";
  refused(bad, "--checkpoint-activations 2: with --strategy pipeline every stage is recomputed whole "
               "(GPipe's re-materialization); give --checkpoint-activations 1");
  // A pipeline's stages recompute themselves: the same run, with each schedule.
  for (const auto& [schedule, kind] : schedule_names()) {
    auto plain_options = o;
    plain_options.strategy = Strategy::kPipeline;
    plain_options.devices = "cpu,cpu";
    plain_options.schedule = kind;
    auto recomputing = plain_options;
    recomputing.checkpoint_activations = 1;
    Trainer plain(plain_options, nullptr), recomputed(recomputing, nullptr);
    plain.run();
    recomputed.run();
    SCOPED_TRACE(std::string("--strategy pipeline --schedule ") + schedule);
    expect_equal_states(state_of(plain), state_of(recomputed));
  }
}

// --shard-optimizer in one process: one rank owns the whole state, and the
// run is the plain one bit for bit (the sharded ranks: ShardedOptimizerCliTest).
// It needs data-parallel ranks: the one-process strategies are refused.
TEST_F(TrainerTest, AShardedOptimizerInOneProcessIsThePlainOneAndNeedsDataParallelRanks) {
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 4;
  Trainer plain(o, nullptr);
  plain.run();
  auto sharded_options = o;
  sharded_options.shard_optimizer = true;
  Trainer sharded(sharded_options, nullptr);
  sharded.run();
  expect_equal_states(state_of(plain), state_of(sharded));

  for (Strategy strategy : {Strategy::kDp, Strategy::kPipeline, Strategy::kNone}) {
    auto bad = sharded_options;
    bad.strategy = strategy;
    if (bad.strategy != Strategy::kNone) bad.devices = "cpu,cpu";
    refused(bad, "--shard-optimizer shards the optimizer state over data-parallel ranks (--strategy auto, "
                 "ddp or allreduce); it does not work with " +
                     std::string(bad.strategy == Strategy::kPipeline ? "a pipeline without dp ranks" : "--strategy ") +
                     (bad.strategy == Strategy::kPipeline ? "" : strategy_name(strategy)));
  }
}

// --sync-bn promises BatchNorm over the whole global batch, which only
// data-parallel ranks give: DataParallel's replicas and a pipeline's
// micro-batches each normalise alone, so the flag is refused there rather
// than ignored.
TEST_F(TrainerTest, SyncBnNeedsDataParallelRanks) {
  auto o = small_run(data_.path());
  o.sync_bn = true;
  o.devices = "cpu,cpu";
  o.strategy = Strategy::kDp;
  refused(o, "--sync-bn normalises BatchNorm over data-parallel ranks (--strategy auto, ddp, allreduce or "
             "fsdp); it does not work with --strategy dp, where each replica normalises its own share of "
             "the batch, as PyTorch's DataParallel does: leave out --sync-bn");
  o.strategy = Strategy::kPipeline;
  refused(o, "it does not work with a pipeline without dp ranks (--mesh pp=P,dp=D replicates its stages), "
             "where each micro-batch is normalised on its own: leave out --sync-bn");
}

// --strategy fsdp in one process has nothing to shard over and trains as
// one process does, bit for bit (the sharded ranks: FsdpCliTest); its flags
// and the options it cannot work with are refused by name.
TEST_F(TrainerTest, FsdpInOneProcessIsPlainAndItsMisfitsAreNamed) {
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 4;
  Trainer plain(o, nullptr);
  plain.run();
  auto fsdp = o;
  fsdp.strategy = Strategy::kFsdp;
  Trainer one(fsdp, nullptr);
  one.run();
  expect_equal_states(state_of(plain), state_of(one));

  // (a change to the FSDP run's options, or to the plain one's, and why it is refused)
  const std::vector<std::tuple<bool, std::function<void(TrainOptions&)>, std::string>> misfits{
      {true, [](TrainOptions& b) { b.shard_optimizer = true; },
       "--shard-optimizer does not go with --strategy fsdp, which shards the momentum already"},
      {true, [](TrainOptions& b) { b.checkpoint_activations = 2; },
       "--checkpoint-activations 2: with --strategy fsdp every unit but the last is recomputed whole"},
      {true, [](TrainOptions& b) { b.ddp_comm_hook = DdpCommHook::kFp16; },
       "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets; --strategy fsdp reduces"},
      {true, [](TrainOptions& b) { b.bucket_cap_mb = 5; }, "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets"},
      {true, [](TrainOptions& b) { b.fsdp_min_unit_params = -1; }, "--fsdp-min-unit-params: expected >= 0, got -1"},
      {false, [](TrainOptions& b) { b.fsdp_sharding = FsdpSharding::kGradOp; },
       "--fsdp-sharding and --fsdp-min-unit-params go with --strategy fsdp"},
      {false, [](TrainOptions& b) { b.fsdp_min_unit_params = 0; },
       "--fsdp-sharding and --fsdp-min-unit-params go with --strategy fsdp"},
      // DDP's tuning with a strategy that has no buckets (allreduce ignored them)
      {false, [](TrainOptions& b) { b.strategy = Strategy::kAllReduce; b.ddp_comm_hook = DdpCommHook::kFp16; },
       "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets (--strategy ddp, or auto over several processes); "
       "--strategy allreduce has none"},
      {false, [](TrainOptions& b) { b.strategy = Strategy::kNone; b.bucket_cap_mb = 5; },
       "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets (--strategy ddp, or auto over several processes); "
       "--strategy none has none"},
  };
  for (const auto& [from_fsdp, change, why] : misfits) {
    auto bad = from_fsdp ? fsdp : o;
    change(bad);
    refused(bad, why);
  }
}

// --profile-out: libtorch's profiler over the steps of --profile-steps,
// written as Chrome trace events: the trainer's phases once per traced step,
// each inside its step, with the ATen operators under them. A run that stops
// inside the window writes what it traced; one that ends before it writes
// nothing. Bad windows and folders are named before anything runs.

}  // namespace
}  // namespace tandem::engine
