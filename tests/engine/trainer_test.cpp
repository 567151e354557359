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

#include "tandem/engine/checkpoint.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/metrics.h"
#include "tandem/engine/profile.h"
#include "tandem/engine/safetensors.h"
#include "tandem/engine/trainer.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::engine {
namespace {

using testing::TempDir;

// A small run on synthetic data: 512 training images, batch 64, 8 steps/epoch.
TrainOptions small_run(const std::string& data_dir) {
  TrainOptions o;
  o.data = "idx:" + data_dir;
  o.model = "convnet";
  o.epochs = 2;
  o.batch_size = 64;
  o.lr = 0.05;
  o.seed = 11;
  o.progress = "off";
  return o;
}

std::vector<std::pair<std::string, torch::Tensor>> state_of(Trainer& trainer) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : trainer.model()->named_parameters()) state.emplace_back(p.key(), p.value().clone());
  for (const auto& b : trainer.model()->named_buffers()) state.emplace_back(b.key(), b.value().clone());
  return state;
}

void expect_equal_states(const std::vector<std::pair<std::string, torch::Tensor>>& a,
                         const std::vector<std::pair<std::string, torch::Tensor>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

// Options the Trainer refuses when constructed, with a message containing `why`.
void refused(const TrainOptions& bad, const std::string& why) {
  try {
    Trainer t(bad, nullptr);
    ADD_FAILURE() << "accepted: " << why;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// The names of the files in `dir`, sorted, but the writer's lock file
// (.tandem-lock, which stays).
std::vector<std::string> file_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != ".tandem-lock") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Runs a Trainer with `o` and returns what it printed on its log.
std::string run_logged(const TrainOptions& o) {
  char* text = nullptr;
  size_t length = 0;
  std::FILE* log = open_memstream(&text, &length);
  Trainer(o, log).run();
  std::fclose(log);
  std::string output(text, length);
  std::free(text);
  return output;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_synthetic_idx(data_.path(), 512, 256); }
  TempDir data_;
};

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
  o.amp = "bf16";
  Trainer bf16(o, nullptr);
  EXPECT_GT(bf16.run().epochs.back().test_acc, 0.9);

  o.amp = "fp16";
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
  o.dtype = "float64";
  o.epochs = 1;
  o.max_steps = 6;
  Trainer whole(o, nullptr);
  auto whole_result = whole.run();
  for (int64_t k : {2, 3, 64}) {
    for (const char* strategy : {"auto", "dp"}) {
      auto chunked_options = o;
      chunked_options.grad_accum = k;
      chunked_options.strategy = strategy;
      if (chunked_options.strategy == "dp") chunked_options.devices = "cpu,cpu";
      Trainer chunked(chunked_options, nullptr);
      auto result = chunked.run();
      std::string what = "--grad-accum " + std::to_string(k) + " --strategy " + strategy;
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
  bad.strategy = "pipeline";
  bad.devices = "cpu,cpu";
  refused(bad, "--grad-accum does not go with --strategy pipeline");
}

// --checkpoint-activations N: the same run bit for bit (the recomputed
// segments do the same arithmetic, and BatchNorm's statistics are updated
// once), plainly, through DataParallel, with --grad-accum, under --amp bf16
// and in pipelines; refused by name where it cannot work.
TEST_F(TrainerTest, CheckpointedActivationsGiveTheSameRun) {
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 4;
  o.dtype = "float64";
  for (const char* strategy : {"auto", "dp"}) {
    for (int64_t accum : {1, 2}) {
      auto plain_options = o;
      plain_options.strategy = strategy;
      if (plain_options.strategy == "dp") plain_options.devices = "cpu,cpu";
      plain_options.grad_accum = accum;
      auto checkpointed_options = plain_options;
      checkpointed_options.checkpoint_activations = 3;
      Trainer plain(plain_options, nullptr), checkpointed(checkpointed_options, nullptr);
      auto a = plain.run(), b = checkpointed.run();
      SCOPED_TRACE(std::string("--strategy ") + strategy + " --grad-accum " + std::to_string(accum));
      expect_equal_states(state_of(plain), state_of(checkpointed));
      EXPECT_EQ(a.epochs.back().train_loss, b.epochs.back().train_loss);
    }
  }
  {  // under bf16 autocast (float32 parameters): the recomputation autocasts as the forward did
    auto plain_options = o;
    plain_options.dtype = "float32";
    plain_options.amp = "bf16";
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
  bad.strategy = "pipeline";
  bad.devices = "cpu,cpu";
  refused(bad, "--checkpoint-activations 2: with --strategy pipeline every stage is recomputed whole "
               "(GPipe's re-materialization); give --checkpoint-activations 1");
  // A pipeline's stages recompute themselves: the same run, with each schedule.
  for (const char* schedule : {"gpipe", "1f1b", "interleaved"}) {
    auto plain_options = o;
    plain_options.strategy = "pipeline";
    plain_options.devices = "cpu,cpu";
    plain_options.schedule = schedule;
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

  for (const char* strategy : {"dp", "pipeline", "none"}) {
    auto bad = sharded_options;
    bad.strategy = strategy;
    if (bad.strategy != "none") bad.devices = "cpu,cpu";
    refused(bad, "--shard-optimizer shards the optimizer state over data-parallel ranks (--strategy auto, "
                 "ddp or allreduce); it does not work with " +
                     std::string(bad.strategy == "pipeline" ? "a pipeline without dp ranks" : "--strategy ") +
                     (bad.strategy == "pipeline" ? "" : strategy));
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
  o.strategy = "dp";
  refused(o, "--sync-bn normalises BatchNorm over data-parallel ranks (--strategy auto, ddp, allreduce or "
             "fsdp); it does not work with --strategy dp, where each replica normalises its own share of "
             "the batch, as PyTorch's DataParallel does: leave out --sync-bn");
  o.strategy = "pipeline";
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
  fsdp.strategy = "fsdp";
  Trainer one(fsdp, nullptr);
  one.run();
  expect_equal_states(state_of(plain), state_of(one));

  // (a change to the FSDP run's options, or to the plain one's, and why it is refused)
  const std::vector<std::tuple<bool, std::function<void(TrainOptions&)>, std::string>> misfits{
      {true, [](TrainOptions& b) { b.shard_optimizer = true; },
       "--shard-optimizer does not go with --strategy fsdp, which shards the momentum already"},
      {true, [](TrainOptions& b) { b.checkpoint_activations = 2; },
       "--checkpoint-activations 2: with --strategy fsdp every unit but the last is recomputed whole"},
      {true, [](TrainOptions& b) { b.ddp_comm_hook = "fp16"; },
       "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets; --strategy fsdp reduces"},
      {true, [](TrainOptions& b) { b.bucket_cap_mb = 5; }, "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets"},
      {true, [](TrainOptions& b) { b.fsdp_sharding = "half"; }, "--fsdp-sharding: expected full or grad-op, got 'half'"},
      {true, [](TrainOptions& b) { b.fsdp_min_unit_params = -1; }, "--fsdp-min-unit-params: expected >= 0, got -1"},
      {false, [](TrainOptions& b) { b.fsdp_sharding = "grad-op"; },
       "--fsdp-sharding and --fsdp-min-unit-params go with --strategy fsdp"},
      {false, [](TrainOptions& b) { b.fsdp_min_unit_params = 0; },
       "--fsdp-sharding and --fsdp-min-unit-params go with --strategy fsdp"},
      // DDP's tuning with a strategy that has no buckets (allreduce ignored them)
      {false, [](TrainOptions& b) { b.strategy = "allreduce"; b.ddp_comm_hook = "fp16"; },
       "--ddp-comm-hook and --bucket-cap-mb tune DDP's buckets (--strategy ddp, or auto over several processes); "
       "--strategy allreduce has none"},
      {false, [](TrainOptions& b) { b.strategy = "none"; b.bucket_cap_mb = 5; },
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
TEST_F(TrainerTest, ProfileOutTracesTheWindowOfSteps) {
  TempDir out;
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 6;
  o.profile_out = out.file("trace.json");
  o.profile_steps = "2:5";
  Trainer(o, nullptr).run();
  auto events = nlohmann::json::parse(testing::read_text(o.profile_out));
  ASSERT_TRUE(events.is_array());
  std::map<std::string, int> count;
  std::vector<std::pair<double, double>> steps;  // [start, end) of each tandem::step
  for (const auto& e : events) {
    const std::string name = e.at("name");
    ++count[name];
    if (name == "tandem::step") steps.emplace_back(e.at("ts").get<double>(), e.at("ts").get<double>() + e.at("dur").get<double>());
  }
  for (const char* phase : {"tandem::step", "tandem::forward", "tandem::backward", "tandem::reduce",
                            "tandem::optimizer"}) {
    EXPECT_EQ(count[phase], 3) << phase;  // steps 2, 3 and 4
  }
  EXPECT_EQ(count["tandem::next_batch"], 2);  // those of steps 3 and 4 (step 2's came before the window)
  EXPECT_GT(count["aten::convolution"], 0);
  EXPECT_GT(count["aten::convolution_backward"], 0);
  for (const auto& e : events) {  // every phase but the batch's fetch lies inside a step
    const std::string name = e.at("name");
    if (name.rfind("tandem::", 0) != 0 || name == "tandem::step" || name == "tandem::next_batch") continue;
    double start = e.at("ts"), end = start + e.at("dur").get<double>();
    EXPECT_TRUE(std::any_of(steps.begin(), steps.end(), [&](const auto& s) {
      return s.first <= start && end <= s.second;
    })) << name << " at " << start;
  }

  auto stopped = o;  // stops after step 2 (--max-steps 3), inside 2:10: a trace of step 2 alone
  stopped.max_steps = 3;
  stopped.profile_steps = "2:10";
  stopped.profile_out = out.file("stopped.json");
  Trainer(stopped, nullptr).run();
  int stopped_steps = 0;
  for (const auto& e : nlohmann::json::parse(testing::read_text(stopped.profile_out))) {
    stopped_steps += e.at("name") == "tandem::step";
  }
  EXPECT_EQ(stopped_steps, 1);

  // A window that ends with the run (here at its last step, 5:6, and cut
  // short, 4:9) holds its steps and not the evaluation after them: no
  // operator starts after the last step ends (it used to trace the whole
  // evaluation, 97% of the events); what follows the step in the loop (its
  // loss and accuracy sums) may be in it.
  for (const char* window : {"5:6", "4:9"}) {
    auto ending = o;
    ending.profile_steps = window;
    ending.profile_out = out.file(std::string("ending-") + window + ".json");
    Trainer(ending, nullptr).run();
    auto traced = nlohmann::json::parse(testing::read_text(ending.profile_out));
    double last_end = 0;
    for (const auto& e : traced) {
      if (e.at("name") == "tandem::step") last_end = std::max(last_end, e.at("ts").get<double>() + e.at("dur").get<double>());
    }
    ASSERT_GT(last_end, 0) << window;
    int after = 0;  // the model's forward after the last step: an evaluation
    std::string names;
    for (const auto& e : traced) {
      const std::string name = e.at("name");
      if (e.at("ts").get<double>() > last_end && name.rfind("aten::", 0) == 0) names += name + " ";
      after += name == "aten::convolution" && e.at("ts").get<double>() > last_end;
    }
    EXPECT_EQ(after, 0) << window << ": after the last step: " << names;
    EXPECT_FALSE(std::filesystem::exists(ending.profile_out + ".tmp-" + std::to_string(::getpid()))) << window;
  }

  auto early = o;  // ends at step 6, before 10:12
  early.profile_steps = "10:12";
  early.profile_out = out.file("never.json");
  Trainer(early, nullptr).run();
  EXPECT_FALSE(std::filesystem::exists(early.profile_out));

  for (const char* window : {"3:3", "4:2", "-1:2", "5", "a:b", "2:"}) {
    auto bad = o;
    bad.profile_steps = window;
    refused(bad, std::string("--profile-steps: expected A:B, the steps from A up to (not including) B "
                             "with 0 <= A < B, e.g. 5:8; got '") + window + "'");
  }
  auto without = o;
  without.profile_out.clear();
  refused(without, "--profile-steps goes with --profile-out");
  auto nowhere = o;
  nowhere.profile_out = out.file("missing/trace.json");
  refused(nowhere, "--profile-out " + nowhere.profile_out + ": " + out.file("missing") +
                       " is not a folder this process can write to");
  auto fifo = o;  // the trace is written whole and renamed: it would replace a FIFO
  fifo.profile_out = out.file("fifo");
  ASSERT_EQ(::mkfifo(fifo.profile_out.c_str(), 0666), 0);
  refused(fifo, "--profile-out " + fifo.profile_out + ": is a FIFO, not a regular file");
}

// Without "{rank}" in the path only rank 0 profiles (one trace for the
// job); with it every rank does, into its own file.
// A flag that had no effect is a warning, printed with --progress off too
// (which silences the run's account, not its warnings).
TEST_F(TrainerTest, WarningsAreNotSilencedByProgressOff) {
  TempDir out;
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.progress = "off";
  o.profile_out = out.file("trace.json");
  o.profile_steps = "50:60";
  std::FILE* log = std::tmpfile();
  ASSERT_NE(log, nullptr);
  Trainer(o, log).run();
  std::rewind(log);
  std::string text;
  for (int c; (c = std::fgetc(log)) != EOF;) text += static_cast<char>(c);
  std::fclose(log);
  EXPECT_EQ(text, "tandem: warning: --profile-steps 50:60: the run ended at step 8, before the window: no trace "
                  "written\n");
}

TEST(StepProfilerTest, RankZeroAloneUnlessThePathNamesTheRank) {
  TempDir out;
  EXPECT_TRUE(StepProfiler({out.file("t.json")}, 0).enabled());
  EXPECT_FALSE(StepProfiler({out.file("t.json")}, 1).enabled());
  EXPECT_FALSE(StepProfiler({""}, 0).enabled());
  StepProfiler third({out.file("t-{rank}.json")}, 3);
  EXPECT_TRUE(third.enabled());
  EXPECT_EQ(third.path(), out.file("t-3.json"));
}

// --clip-grad-norm X: with plain SGD (no momentum or weight decay) and
// gradients above the limit, one step moves the weights by exactly lr * X
// in 2-norm, whatever the strategy; with fp16's loss scaler the gradients
// are unscaled first (clipping the scaled ones would move them 65536 times
// less).
TEST_F(TrainerTest, AClippedStepMovesTheWeightsByTheLearningRateTimesTheLimit) {
  auto o = small_run(data_.path());
  o.model = "mlp";
  o.epochs = 1;
  o.max_steps = 1;
  o.momentum = 0;
  o.weight_decay = 0;
  o.warmup_epochs = 0;
  o.lr = 0.1;
  o.clip_grad_norm = 1e-3;
  struct Case {
    std::string what;
    std::function<void(TrainOptions&)> set;
    double tolerance;
  };
  std::vector<Case> cases = {
      {"float64", [](TrainOptions& c) { c.dtype = "float64"; }, 1e-5},
      {"float32", [](TrainOptions&) {}, 1e-4},
      {"--amp fp16", [](TrainOptions& c) { c.amp = "fp16"; }, 1e-3},
      {"--grad-accum 4", [](TrainOptions& c) { c.grad_accum = 4; }, 1e-4},
      {"--strategy dp", [](TrainOptions& c) { c.strategy = "dp"; c.devices = "cpu,cpu"; }, 1e-4},
      {"--strategy pipeline", [](TrainOptions& c) { c.strategy = "pipeline"; c.devices = "cpu,cpu"; }, 1e-4},
  };
  for (const auto& c : cases) {
    auto options = o;
    c.set(options);
    Trainer trainer(options, nullptr);
    auto before = state_of(trainer);
    trainer.run();
    auto after = state_of(trainer);
    double squares = 0;
    for (size_t i = 0; i < before.size(); ++i) {
      squares += (after[i].second - before[i].second).to(torch::kFloat64).pow(2).sum().item<double>();
    }
    EXPECT_NEAR(std::sqrt(squares), o.lr * o.clip_grad_norm, c.tolerance * o.lr * o.clip_grad_norm) << c.what;
  }
  auto bad = o;
  bad.clip_grad_norm = -1;
  try {
    Trainer t(bad, nullptr);
    ADD_FAILURE() << "accepted a negative --clip-grad-norm";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--clip-grad-norm: expected a finite number >= 0 (0: off), got -1");
  }
}

// --cuda-graph refuses what it cannot capture, by name: the run of
// CudaGraphTrainsLikeTheEagerStepOnTheGpu on the CPU (the default device; on
// any machine).
TEST_F(TrainerTest, CudaGraphNeedsACudaDevice) {
  auto o = small_run(data_.path());
  o.batch_size = 48;
  o.cuda_graph = true;
  refused(o, "--cuda-graph needs --device cuda");
}

// On a GPU --cuda-graph refuses what it cannot capture, by name, and trains
// like the eager step (the same arithmetic, up to the rounding of -lr * d and
// cuDNN's choices), replaying all but the warm-up steps and the short last
// batch of each epoch.
TEST_F(TrainerTest, CudaGraphTrainsLikeTheEagerStepOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  auto o = small_run(data_.path());
  o.batch_size = 48;  // 512 samples: 10 full batches and one of 32 per epoch
  o.cuda_graph = true;
  o.device = "cuda";
  auto fp16 = o;
  fp16.amp = "fp16";
  refused(fp16, "--cuda-graph does not work with --amp fp16");
  auto dp = o;
  dp.strategy = "dp";
  dp.devices = "cuda:0,cuda:0";
  refused(dp, "--cuda-graph captures the step of one process on one device");
  auto fsdp = o;
  fsdp.strategy = "fsdp";  // its gathers and reductions are collectives on the host's schedule
  refused(fsdp, "--cuda-graph captures the step of one process on one device; it does not work "
                "with --strategy fsdp");

  // Autograd's warnings, caught on this thread (its engine replays a
  // backward's warnings on the thread that called it).
  struct Warnings : c10::WarningHandler {
    std::vector<std::string> seen;
    void process(const c10::Warning& w) override { seen.push_back(w.msg()); }
  } warnings;
  Trainer graphed(o, nullptr);
  TrainResult result;
  {
    c10::WarningUtils::WarningHandlerGuard guard(&warnings);
    result = graphed.run();
  }
  // Note [detached step outputs]: no AccumulateGrad node outlives its step.
  for (const auto& w : warnings.seen) EXPECT_EQ(w.find("AccumulateGrad"), std::string::npos) << w;
  o.cuda_graph = false;
  Trainer eager(o, nullptr);
  auto reference = eager.run();
  ASSERT_EQ(result.steps, reference.steps);
  EXPECT_EQ(result.graph_eager_steps, 3 + 2);  // warm-up, and each epoch's short last batch
  EXPECT_EQ(result.graph_replays, result.steps - result.graph_eager_steps);
  EXPECT_NEAR(result.epochs.back().test_acc, reference.epochs.back().test_acc, 0.02);
  for (const auto& p : eager.model()->named_parameters()) {
    auto other = graphed.model()->named_parameters()[p.key()];
    EXPECT_TRUE(torch::allclose(p.value(), other, 1e-2, 1e-3)) << p.key();
  }
}

// capture_options_for readies an Sgd for a captured step (on any machine:
// no graph is made): the learning rate moves into a tensor at once, and the
// state freezes only in before_capture, after the hook given before it.
TEST(CudaGraphOptionsTest, CaptureOptionsForSgdMoveTheLearningRateAndFreezeBeforeCapture) {
  std::vector<torch::Tensor> params = {torch::randn({3}).requires_grad_()};
  optim::Sgd sgd(params, torch::optim::SGDOptions(0.1).momentum(0.9));
  std::vector<std::string> calls;
  CudaGraphOptions given;
  given.before_capture = [&] { calls.push_back(sgd.state_frozen() ? "frozen" : "not yet"); };
  auto options = capture_options_for(sgd, given);
  EXPECT_TRUE(sgd.has_lr_tensor());
  EXPECT_FALSE(sgd.state_frozen());
  params[0].mutable_grad() = torch::ones({3});
  sgd.step();  // the warm-up makes the momentum buffer
  ASSERT_TRUE(options.before_capture);
  options.before_capture();
  EXPECT_EQ(calls, std::vector<std::string>{"not yet"});
  EXPECT_TRUE(sgd.state_frozen());
  EXPECT_TRUE(capture_options_for(sgd).before_capture);  // no hook given: freezing alone
}

TEST_F(TrainerTest, ResumeRefusesACheckpointOfOtherSettings) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.epochs = 1;
  Trainer(o, nullptr).run();
  o.resume = true;
  o.lr = 0.5;
  Trainer other(o, nullptr);
  try {
    other.run();
    FAIL() << "resumed with another learning rate";
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("cannot resume from " + checkpoints.file("checkpoint-00000008.pt")),
              std::string::npos) << message;
    EXPECT_NE(message.find("other settings"), std::string::npos) << message;
  }
  // A gradient clipping limit is a setting too; the number of chunks
  // (--grad-accum) is not: a run may resume with fewer activations in memory.
  o.lr = small_run(data_.path()).lr;
  o.clip_grad_norm = 1.0;
  EXPECT_THROW(Trainer(o, nullptr).run(), Error);
  auto chunked = small_run(data_.path());
  chunked.grad_accum = 2;
  EXPECT_EQ(Trainer(chunked, nullptr).fingerprint(), Trainer(small_run(data_.path()), nullptr).fingerprint());
  // A format's default given explicitly is the default (IDX: no preset, the
  // files' own 28 px), as it trains the same; another value is not.
  auto explicit_defaults = small_run(data_.path());
  explicit_defaults.augment = "none";
  explicit_defaults.image_size = 28;
  EXPECT_EQ(Trainer(explicit_defaults, nullptr).fingerprint(),
            Trainer(small_run(data_.path()), nullptr).fingerprint());
  auto resized = small_run(data_.path());
  resized.image_size = 32;
  EXPECT_NE(Trainer(resized, nullptr).fingerprint().find("image_size=32"), std::string::npos);
}

TEST_F(TrainerTest, GarbageCheckpointIsRefusedWithItsName) {
  TempDir checkpoints;
  std::ofstream(checkpoints.file("checkpoint-00000003.pt")) << "not a checkpoint";
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.resume = true;
  Trainer trainer(o, nullptr);
  try {
    trainer.run();
    FAIL();
  } catch (const Error& e) {
    std::string message = e.what();
    EXPECT_NE(message.find("--resume: no usable checkpoint in " + checkpoints.path()), std::string::npos)
        << message;
    EXPECT_NE(message.find("cannot resume from " + checkpoints.file("checkpoint-00000003.pt") +
                           ": damaged: no tandem checksum trailer"),
              std::string::npos) << message;
  }
}

// Note [pickle bounds]: fuzz_checkpoint's finding (fuzz/regressions/
// checkpoint/): a 13 kB archive, sealed with a valid trailer, whose data.pkl
// stores into memo slot 1.6 billion, which made libtorch's unpickler grow
// its memo table to 25.6 GB. It is refused before libtorch reads it, with
// the record and what it declares.
TEST(CheckpointTest, FieldsThatMayChangeAreLeftOutOfTheComparison) {
  EXPECT_EQ(without_fields("model=mlp lr=0.1 world=2 seed=3", {"world"}), "model=mlp lr=0.1 seed=3");
  EXPECT_EQ(without_fields("model=mlp world=2", {}), "model=mlp world=2");
  EXPECT_EQ(without_fields("world=2 worldly=1 x=world=2", {"world"}), "worldly=1 x=world=2");
  EXPECT_EQ(fingerprint_field("worldly=1 world=2 x=world=3", "world"), "2");
  EXPECT_EQ(fingerprint_field("model=mlp", "world"), std::nullopt);
  // A --data path with spaces is one value (one word of it that looks like
  // KEY=VALUE, such as "/a world=3", would still start a field).
  const std::string spaced = "data=idx:/my data/Fashion MNIST world=2";
  EXPECT_EQ(fingerprint_field(spaced, "data"), "idx:/my data/Fashion MNIST");
  EXPECT_EQ(fingerprint_field(spaced, "world"), "2");
  EXPECT_EQ(without_fields(spaced, {"world"}), "data=idx:/my data/Fashion MNIST");

  TempDir dir;
  torch::manual_seed(1);
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer plain({dir.path()});
  auto path = plain.save(TrainPosition{}, *model, sgd, "model=linear lr=0.1 world=2");
  Checkpointer elastic({dir.path(), 2, {"world"}});
  auto position = elastic.load(path, *model, sgd, "model=linear lr=0.1 world=4");
  EXPECT_EQ(position.fingerprint, "model=linear lr=0.1 world=2");
  EXPECT_THROW(plain.load(path, *model, sgd, "model=linear lr=0.1 world=4"), Error);
  EXPECT_THROW(elastic.load(path, *model, sgd, "model=linear lr=0.2 world=2"), Error);
}

// The refusal of a checkpoint written under other settings names the fields
// that differ, not only the two fingerprints.
TEST(CheckpointTest, FingerprintDifferencesNameTheFields) {
  EXPECT_EQ(fingerprint_differences("model=mlp lr=0.1 world=2", "model=mlp lr=0.1 world=4", {"world"}), "");
  EXPECT_EQ(fingerprint_differences("model=mlp lr=0.1 batch=32 world=2", "model=convnet lr=0.1 batch=64 world=4",
                                    {"world"}),
            "model=mlp in the checkpoint, model=convnet in this run, batch=32 in the checkpoint, "
            "batch=64 in this run");
  EXPECT_EQ(fingerprint_differences("model=mlp", "model=mlp clip=1", {}), "no clip in the checkpoint, clip=1 in this run");
  EXPECT_EQ(fingerprint_differences("data=idx:/a b model=mlp", "data=idx:/a c model=mlp", {}),
            "data=idx:/a b in the checkpoint, data=idx:/a c in this run");

  TempDir dir;
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer checkpointer({dir.path()});
  auto path = checkpointer.save(TrainPosition{}, *model, sgd, "model=linear lr=0.1");
  EXPECT_EQ(testing::error_of([&] { checkpointer.load(path, *model, sgd, "model=linear lr=0.2"); }),
            "cannot resume from " + path + ": it was written by a run with other settings (lr=0.1 in the "
            "checkpoint, lr=0.2 in this run); resume with the checkpoint's settings, or train afresh in "
            "another --checkpoint-dir (the checkpoint's: model=linear lr=0.1; this run's: model=linear lr=0.2)");
}

// A checkpoint's zip archive (without the trailer) with every record passed
// through `edit`, sealed again: a file whose CRC holds, as a tampered one's would.
std::string rewritten_checkpoint(const std::string& path,
                                 const std::function<void(const std::string&, std::string&)>& edit) {
  std::string sealed = testing::read_text(path);
  std::istringstream zip(sealed.substr(0, sealed.size() - 20));  // Note [checkpoint trailer]: 20 bytes
  caffe2::serialize::PyTorchStreamReader reader(&zip);
  std::string out;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    out.append(static_cast<const char*>(data), size);
    return size;
  });
  for (const auto& name : reader.getAllRecords()) {
    // The writer's own records, written at its end.
    if (name == "version" || name == "byteorder" || name.rfind(".data/", 0) == 0) continue;
    auto [data, size] = reader.getRecord(name);
    std::string bytes(static_cast<const char*>(data.get()), size);
    edit(name, bytes);
    writer.writeRecord(name, bytes.data(), bytes.size());
  }
  writer.writeEndOfFile();
  return seal_checkpoint(out);
}

// libtorch's unpickler sizes a storage by its record and a tensor by
// data.pkl without comparing the two: a record cut short was read past its
// end (NaN weights, or a crash). It is refused, naming the tensor.
TEST(CheckpointTest, ATensorLongerThanItsRecordIsRefused) {
  TempDir dir;
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  model->forward(torch::ones({1, 3})).sum().backward();
  sgd.step();  // momentum buffers to save
  Checkpointer checkpointer({dir.path()});
  auto path = checkpointer.save(TrainPosition{}, *model, sgd, "model=linear");
  ASSERT_NO_THROW(checkpointer.load(path, *model, sgd, "model=linear"));
  // The weight (and its momentum) are 24 bytes, the bias (and its) 8.
  for (const auto& [name, size] : std::vector<std::pair<std::string, size_t>>{{"weight", 24}, {"bias", 8}}) {
    const std::string cut = dir.file("cut-" + name + ".pt");
    std::ofstream(cut, std::ios::binary) << rewritten_checkpoint(path, [&](const std::string& record, std::string& bytes) {
      if (record.rfind("data/", 0) == 0 && bytes.size() == size) bytes.resize(4);
    });
    std::string message = testing::error_of([&] { checkpointer.load(cut, *model, sgd, "model=linear"); });
    EXPECT_NE(message.find("cannot resume from " + cut + ": model." + name + ": data.pkl declares its storage as " +
                           std::to_string(size) + " bytes, and no record of the archive left holds that many"),
              std::string::npos)
        << message;
  }
}

// Only regular files named checkpoint-<step>.pt count: a directory or a FIFO
// of that name is neither resumed from (the FIFO would block the read) nor
// kept in place of a real checkpoint when older ones are removed.
TEST(CheckpointTest, OnlyRegularFilesCountAsCheckpoints) {
  TempDir dir;
  std::filesystem::create_directory(dir.file("checkpoint-00000050.pt"));
  ASSERT_EQ(::mkfifo(dir.file("checkpoint-00000060.pt").c_str(), 0600), 0);
  std::ofstream(dir.file("checkpoint-99999999999999999999.pt")) << "too large a step";
  torch::nn::Linear model(3, 2);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  Checkpointer checkpointer({dir.path()});
  TrainPosition p;
  for (p.step = 1; p.step <= 3; ++p.step) checkpointer.save(p, *model, sgd, "model=linear");
  EXPECT_FALSE(std::filesystem::exists(dir.file("checkpoint-00000001.pt")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("checkpoint-00000002.pt")));
  EXPECT_EQ(checkpointer.latest(), dir.file("checkpoint-00000003.pt"));
  TrainPosition loaded;
  std::vector<std::string> warnings;
  EXPECT_EQ(checkpointer.load_newest_good(loaded, *model, sgd, "model=linear", &warnings),
            dir.file("checkpoint-00000003.pt"));
  EXPECT_EQ(loaded.step, 3);
  EXPECT_TRUE(warnings.empty());
}

// Two fuzz findings (fuzz/regressions/checkpoint): a data.pkl that stores
// into memo slot 1.6 billion, and a code record's .debug_pkl (unpickled by
// libtorch when the archive's code fails to parse) declaring a 3.4e18-byte
// string. Both are refused by Note [pickle bounds] before libtorch reads them.
TEST(CheckpointTest, APickleThatOverstatesItsMemoIsRefusedBeforeLibtorchReadsIt) {
  for (const auto& [file, why] : std::vector<std::pair<std::string, std::string>>{
           {"memo-index-1.6-billion", "data.pkl: memo index "},
           {"debug-pkl-string-3e18", ".debug_pkl: "}}) {
    std::ifstream in(std::string(TANDEM_SOURCE_DIR) + "/fuzz/regressions/checkpoint/" + file, std::ios::binary);
    std::string input((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GT(input.size(), 1u) << file;
    ASSERT_EQ(input[0] % 2, 1) << file;  // the fuzzer's "archive, sealed" path
    TempDir dir;
    auto path = dir.file("checkpoint-00000001.pt");
    std::ofstream(path, std::ios::binary) << seal_checkpoint(input.substr(1));
    torch::nn::Linear model(2, 2);
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
    try {
      Checkpointer({dir.path()}).load(path, *model, sgd, "fuzz");
      ADD_FAILURE() << file << ": the archive loaded";
    } catch (const tandem::Error& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("cannot resume from " + path + ": not a readable tandem checkpoint ("),
                std::string::npos) << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
    }
  }
}

// Issue 7: a checkpoint cut short or altered on disk is caught by its
// checksum, before anything is loaded; resume falls back to the one before
// it (atomic writes keep it intact) and still ends with the uninterrupted
// run's weights.
TEST_F(TrainerTest, DamagedCheckpointsAreRefusedAndResumeFallsBack) {
  auto o = small_run(data_.path());
  Trainer whole(o, nullptr);
  whole.run();
  for (std::string damage : {"truncate", "flip"}) {
    TempDir checkpoints;
    o.checkpoint_dir = checkpoints.path();
    o.checkpoint_every = 3;
    o.max_steps = 10;  // keeps checkpoint-00000009.pt (every 3 steps) and -00000010.pt (the stop)
    o.progress = "off";
    o.resume = false;
    Trainer(o, nullptr).run();
    auto newest = checkpoints.file("checkpoint-00000010.pt");
    ASSERT_TRUE(std::filesystem::exists(newest));
    auto size = std::filesystem::file_size(newest);
    if (damage == "truncate") {
      std::filesystem::resize_file(newest, size - 100);
    } else {
      std::fstream f(newest, std::ios::in | std::ios::out | std::ios::binary);
      f.seekg(static_cast<std::streamoff>(size / 2));
      char c = 0;
      f.read(&c, 1);
      f.seekp(static_cast<std::streamoff>(size / 2));
      c = static_cast<char>(c ^ 0x10);
      f.write(&c, 1);
    }
    o.max_steps = 0;
    o.resume = true;
    o.progress = "lines";
    char* text = nullptr;
    size_t length = 0;
    std::FILE* log = open_memstream(&text, &length);
    Trainer second(o, log);
    second.run();
    std::fclose(log);
    std::string output(text, length);
    std::free(text);
    EXPECT_NE(output.find("tandem: warning: cannot resume from " + newest + ": damaged: " +
                          (damage == "truncate" ? std::string("no tandem checksum trailer")
                                                : std::string("its CRC-32 does not match"))),
              std::string::npos) << damage << "\n" << output;
    EXPECT_NE(output.find("resumed from " + checkpoints.file("checkpoint-00000009.pt")), std::string::npos)
        << damage << "\n" << output;
    expect_equal_states(state_of(whole), state_of(second));
  }
}

// A --checkpoint-dir where nothing can be written is refused before the
// first step, not at the first save (a read-only tmpfs: root writes anywhere else).
TEST_F(TrainerTest, AnUnwritableCheckpointDirIsRefusedAtTheStart) {
  TempDir checkpoints;
  testing::TmpfsMount read_only(checkpoints.path(), "ro,size=1m");
  ASSERT_TRUE(read_only.ok) << "this test mounts a read-only tmpfs and needs root: " << read_only.output;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
            "--checkpoint-dir " + checkpoints.path() + ": cannot write there: Read-only file system");
  TempDir elsewhere;
  std::ofstream(elsewhere.file("a-file")) << "not a directory";
  o.checkpoint_dir = elsewhere.file("a-file");
  EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
            "--checkpoint-dir " + o.checkpoint_dir + ": is a regular file; expected a folder (or nothing there yet)");
}

// Issue 7: the disk fills up while a checkpoint is written (a 5 MiB tmpfs
// holds one convnet checkpoint of about 3.4 MB, not two). The run ends with
// an error naming the file and the system's reason; the checkpoint before it
// is intact and loads. Mounting needs root, which these machines give; the
// test fails, not skips, without it.
TEST_F(TrainerTest, AFullDiskLeavesThePreviousCheckpointIntact) {
  TempDir checkpoints;
  testing::TmpfsMount small(checkpoints.path(), "size=5m");
  ASSERT_TRUE(small.ok) << "this test mounts a small tmpfs and needs root: " << small.output;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  Trainer trainer(o, nullptr);
  std::string message;
  try {
    trainer.run();
  } catch (const Error& e) {
    message = e.what();
  }
  EXPECT_NE(message.find(checkpoints.file("checkpoint-00000016.pt.tmp-")), std::string::npos) << message;
  EXPECT_NE(message.find("No space left on device"), std::string::npos) << message;
  EXPECT_EQ(file_names(checkpoints.path()), (std::vector<std::string>{"checkpoint-00000008.pt"}));  // no temporary left
  Trainer fresh(o, nullptr);
  torch::optim::SGD sgd(fresh.model()->parameters(), 0.1);
  TrainPosition position;
  std::vector<std::string> damaged;
  auto path = Checkpointer({checkpoints.path()})
                  .load_newest_good(position, *fresh.model(), sgd, fresh.fingerprint(), &damaged);
  ASSERT_TRUE(path.has_value());
  EXPECT_EQ(*path, checkpoints.file("checkpoint-00000008.pt"));
  EXPECT_TRUE(damaged.empty());
  EXPECT_EQ(position.step, 8);
}

// Note [diverged]: a learning rate of a million makes the loss NaN within
// the first epoch; the run stops at the epoch's end, before its checkpoint,
// on an error that says where and what to change. A sane rate never stops
// (every other test).
TEST_F(TrainerTest, ADivergedRunStopsBeforeWritingACheckpoint) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.lr = 1e6;
  o.warmup_epochs = 0;
  o.checkpoint_dir = checkpoints.path();
  auto message = testing::error_of([&] { Trainer(o, nullptr).run(); });
  EXPECT_EQ(message.rfind("training diverged: the loss became ", 0), 0u) << message;
  EXPECT_NE(message.find(" between steps 0 and 8 (epoch 1); stopped before writing a checkpoint of it: the "
                         "learning rate was "),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(": train again with a lower --lr"), std::string::npos) << message;
  EXPECT_TRUE(file_names(checkpoints.path()).empty());
}

// A rank 0 killed while it wrote a checkpoint leaves "checkpoint-N.pt.tmp-PID".
// The next run in that directory removes such files whose process is gone,
// and leaves a live process's file (another run may be writing it).
TEST_F(TrainerTest, TemporariesOfDeadProcessesAreRemovedAtTheStart) {
  TempDir checkpoints;
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // a PID that no longer runs
  const std::string dead = "checkpoint-00000008.pt.tmp-" + std::to_string(child);
  const std::string live = "checkpoint-00000008.pt.tmp-1";  // init
  const std::string other = "checkpoint-00000008.pt.tmp-x" + std::to_string(child);  // not tandem's name
  for (const auto& name : {dead, live, other}) std::ofstream(checkpoints.file(name)) << "partial";
  EXPECT_EQ(Checkpointer({checkpoints.path()}).remove_stale_temporaries(), (std::vector<std::string>{dead}));
  std::ofstream(checkpoints.file(dead)) << "partial";
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.checkpoint_dir = checkpoints.path();
  Trainer(o, nullptr).run();
  auto names = file_names(checkpoints.path());
  EXPECT_EQ(names, (std::vector<std::string>{"checkpoint-00000008.pt", live, other}));
}

TEST_F(TrainerTest, CheckpointsKeepOnlyTheNewestTwo) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.epochs = 3;
  o.checkpoint_dir = checkpoints.path();
  Trainer(o, nullptr).run();
  EXPECT_EQ(file_names(checkpoints.path()),
            (std::vector<std::string>{"checkpoint-00000016.pt", "checkpoint-00000024.pt"}));
}

// Runs stop before a checkpoint of a diverged loss (Note [diverged]), but
// older ones wrote them: a checkpoint whose weights are not finite is passed
// over like a damaged one, and the run resumes from the one before it
// (it used to train on in NaN and blame the learning rate).
TEST_F(TrainerTest, ACheckpointOfNonFiniteWeightsIsPassedOverAsDamaged) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.checkpoint_every = 5;
  o.max_steps = 10;  // keeps -00000005.pt and -00000010.pt
  Trainer(o, nullptr).run();
  {
    // Step 10's checkpoint with one weight made NaN, written as step 11.
    Trainer t(o, nullptr);
    torch::optim::SGD sgd(t.model()->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    Checkpointer c(CheckpointOptions{checkpoints.path(), 3});
    auto position = c.load(checkpoints.file("checkpoint-00000010.pt"), *t.model(), sgd, t.fingerprint());
    {
      torch::NoGradGuard no_grad;
      t.model()->parameters().front().view(-1)[0] = std::nan("");
    }
    position.step = 11;
    c.save(position, *t.model(), sgd, t.fingerprint());
  }
  o.resume = true;
  o.max_steps = 12;
  o.progress = "lines";
  const std::string output = run_logged(o);
  EXPECT_NE(output.find("tandem: warning: cannot resume from " + checkpoints.file("checkpoint-00000011.pt") +
                        ": damaged: its weights hold NaN or infinite values (conv1.weight), as a diverged run's do"),
            std::string::npos) << output;
  EXPECT_NE(output.find("resumed from " + checkpoints.file("checkpoint-00000010.pt")), std::string::npos) << output;
}

// Two runs writing into one --checkpoint-dir would replace each other's
// files: the writer holds DIR/.tandem-lock, and a second run is refused
// while it does (naming the holder), then accepted once it is released.
TEST_F(TrainerTest, ASecondRunOnTheDirectoryIsRefusedWhileTheFirstHoldsIt) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.max_steps = 2;
  o.checkpoint_dir = checkpoints.path();
  {
    Checkpointer first(CheckpointOptions{checkpoints.path()});
    first.check_writable();
    first.lock();
    EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
              "--checkpoint-dir " + checkpoints.path() + " is in use by another run (process " +
                  std::to_string(::getpid()) + "), which holds " + checkpoints.file(".tandem-lock") +
                  "; give another directory, or wait until that run ends (--resume then continues it)");
    EXPECT_TRUE(file_names(checkpoints.path()).empty());
  }
  Trainer(o, nullptr).run();
  EXPECT_EQ(file_names(checkpoints.path()), (std::vector<std::string>{"checkpoint-00000002.pt"}));
}

// The same --data text may name a data set that changed since the
// checkpoint: its place in the epoch would mean other samples (and past the
// new epoch's end, steps at a learning rate of 0). Refused, naming both sizes.
TEST_F(TrainerTest, ResumeRefusesADataSetOfAnotherSize) {
  TempDir data, checkpoints;
  testing::write_synthetic_idx(data.path(), 512, 64);
  auto o = small_run(data.path());
  o.max_steps = 7;
  o.checkpoint_dir = checkpoints.path();
  Trainer(o, nullptr).run();
  testing::write_synthetic_idx(data.path(), 128, 64);
  o.max_steps = 0;
  o.resume = true;
  EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
            "cannot resume from " + checkpoints.file("checkpoint-00000007.pt") +
                ": it was written by a run on 512 training samples, but --data idx:" + data.path() +
                " now has 128: the data set changed since; resume on the data it was written with, or train "
                "from the beginning in a new --checkpoint-dir");
}

// A file named for a later step than the one resumed from is none of this
// run's: a damaged one is removed at the run's next save (left, it would
// take one of the two kept places and be tried first by every --resume),
// and one whose name and content disagree (a checkpoint renamed to a later
// step) is passed over like a damaged one, not resumed before newer work.
TEST_F(TrainerTest, CheckpointsOfLaterStepsThanTheRunsAreNotKeptOrTrusted) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.checkpoint_every = 3;
  o.max_steps = 10;  // keeps -00000009.pt and -00000010.pt
  Trainer(o, nullptr).run();
  const auto ten = checkpoints.file("checkpoint-00000010.pt");
  std::filesystem::copy_file(ten, checkpoints.file("checkpoint-00000050.pt"));
  std::filesystem::copy_file(ten, checkpoints.file("checkpoint-00000099.pt"));
  std::filesystem::resize_file(checkpoints.file("checkpoint-00000099.pt"), 1000);
  o.resume = true;
  o.max_steps = 12;
  o.progress = "lines";
  const std::string output = run_logged(o);
  EXPECT_NE(output.find("tandem: warning: cannot resume from " + checkpoints.file("checkpoint-00000099.pt") +
                        ": damaged"), std::string::npos) << output;
  EXPECT_NE(output.find("tandem: warning: cannot resume from " + checkpoints.file("checkpoint-00000050.pt") +
                        ": its name says step 50, but it holds step 10"), std::string::npos) << output;
  EXPECT_NE(output.find("resumed from " + ten + " (epoch 2, step 10)"), std::string::npos) << output;
  EXPECT_EQ(file_names(checkpoints.path()),
            (std::vector<std::string>{"checkpoint-00000010.pt", "checkpoint-00000012.pt"}));
}

TEST_F(TrainerTest, MetricsLinesAndExportedWeights) {
  TempDir out;
  auto o = small_run(data_.path());
  o.metrics_out = out.file("m.jsonl");
  o.export_weights = out.file("w.safetensors");
  Trainer trainer(o, nullptr);
  auto result = trainer.run();
  std::ifstream in(o.metrics_out);
  std::string line;
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    ++lines;
    EXPECT_EQ(j["epoch"], lines);
    EXPECT_EQ(j["step"], 8 * lines);
    EXPECT_EQ(j["world_size"], 1);
    for (const char* key : {"train_loss", "test_loss", "test_acc", "epoch_seconds", "images_per_second"}) {
      EXPECT_TRUE(j[key].is_number()) << key;
    }
    EXPECT_DOUBLE_EQ(j["test_acc"].get<double>(), result.epochs[lines - 1].test_acc);
  }
  EXPECT_EQ(lines, 2);
  auto file = read_safetensors(o.export_weights);
  auto state = state_of(trainer);
  expect_equal_states(file.tensors, state);

  // read_metrics gives the records back as the run returned them.
  auto records = read_metrics(o.metrics_out);
  ASSERT_EQ(records.size(), 2u);
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& a = records[i];
    const auto& b = result.epochs[i];
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_EQ(a.step, b.step);
    EXPECT_DOUBLE_EQ(a.train_loss, b.train_loss);
    EXPECT_DOUBLE_EQ(a.test_acc, b.test_acc);
    EXPECT_DOUBLE_EQ(a.images_per_second, b.images_per_second);
    EXPECT_EQ(a.world_size, b.world_size);
    EXPECT_EQ(a.partial, b.partial);
    EXPECT_TRUE(a.evaluated);
  }
  std::ofstream(out.file("bad.jsonl")) << to_json_line(records[0]) << "\n{\"epoch\": 2}\n";
  EXPECT_THROW(
      {
        try {
          read_metrics(out.file("bad.jsonl"));
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not a metrics record"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  EXPECT_THROW(read_metrics(out.file("missing.jsonl")), Error);

  // load_weights puts the exported weights into a fresh model of the same
  // flags, which then evaluates as the run did after its last epoch.
  Trainer fresh(small_run(data_.path()), nullptr);
  load_weights(o.export_weights, *fresh.model());
  expect_equal_states(state_of(fresh), state);
  auto eval = fresh.evaluate();
  EXPECT_EQ(eval.accuracy, result.epochs.back().test_acc);
  EXPECT_DOUBLE_EQ(eval.loss, result.epochs.back().test_loss);

  // --init-weights: a run that starts from them begins with these weights.
  auto warm = small_run(data_.path());
  warm.init_weights = o.export_weights;
  warm.seed = 99;  // another random initialisation, replaced
  Trainer started(warm, nullptr);
  expect_equal_states(state_of(started), state);
  warm.init_weights = out.file("absent.safetensors");
  try {
    Trainer t(warm, nullptr);
    ADD_FAILURE() << "started from a file that is not there";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "--init-weights: " + warm.init_weights + ": no such file (expected a safetensors file)");
  }

  // On --resume the checkpoint's weights replace them, and the run says so
  // (it used to be silent).
  TempDir checkpoints;
  auto checkpointed = small_run(data_.path());
  checkpointed.checkpoint_dir = checkpoints.path();
  checkpointed.max_steps = 2;
  Trainer(checkpointed, nullptr).run();
  checkpointed.resume = true;
  checkpointed.max_steps = 3;
  checkpointed.progress = "lines";
  checkpointed.init_weights = o.export_weights;
  const std::string resumed = run_logged(checkpointed);
  EXPECT_NE(resumed.find("--init-weights " + o.export_weights + " is not used: the checkpoint's weights replace it"),
            std::string::npos) << resumed;

  // --init-weights-except: the head of a file made for 5 classes is left out
  // (fine-tuning), the rest loads; the head keeps the seed's initialisation.
  NamedTensors five_classes;
  for (const auto& [name, tensor] : file.tensors) {
    five_classes.emplace_back(name, name.rfind("fc2.", 0) == 0 ? tensor.narrow(0, 0, 5).clone() : tensor);
  }
  write_safetensors(out.file("five.safetensors"), five_classes);
  auto tuned = small_run(data_.path());
  tuned.init_weights = out.file("five.safetensors");
  try {
    Trainer strict(tuned, nullptr);
    ADD_FAILURE() << "loaded a head of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'fc2."), std::string::npos) << e.what();
  }
  tuned.init_weights_except = "fc2";
  Trainer head_aside(tuned, nullptr);
  Trainer seeded(small_run(data_.path()), nullptr);
  auto loaded = state_of(head_aside), initial = state_of(seeded);
  for (size_t i = 0; i < loaded.size(); ++i) {
    bool head = loaded[i].first.rfind("fc2.", 0) == 0;
    EXPECT_TRUE(torch::equal(loaded[i].second, head ? initial[i].second : state[i].second)) << loaded[i].first;
  }
  tuned.init_weights_except = "fc3";
  try {
    Trainer misspelt(tuned, nullptr);
    ADD_FAILURE() << "accepted an --init-weights-except that names nothing";
  } catch (const UsageError& e) {  // the command line's mistake: exit 2
    EXPECT_NE(std::string(e.what()).find("--init-weights, --init-weights-except: 'fc3' names no parameter or "
                                         "buffer of the model"),
              std::string::npos)
        << e.what();
  }

  // Strict: a tensor missing, one too many, or one of another shape is named.
  auto expect_refused = [&](const NamedTensors& tensors, const std::string& why) {
    write_safetensors(out.file("other.safetensors"), tensors);
    Trainer target(small_run(data_.path()), nullptr);
    auto before = state_of(target);
    try {
      load_weights(out.file("other.safetensors"), *target.model());
      ADD_FAILURE() << "loaded: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(out.file("other.safetensors") + ": " + why), std::string::npos)
          << e.what();
    }
    expect_equal_states(state_of(target), before);  // nothing copied
  };
  NamedTensors missing(file.tensors.begin() + 1, file.tensors.end());
  expect_refused(missing, "no tensor for the model's");
  NamedTensors extra = file.tensors;
  extra.emplace_back("head.extra", torch::zeros({2}));
  expect_refused(extra, "tensor 'head.extra' is not a parameter or buffer of the model");
  NamedTensors reshaped = file.tensors;
  reshaped.back().second = torch::zeros({reshaped.back().second.numel() + 1});
  expect_refused(reshaped, "tensor '" + reshaped.back().first + "' has shape");
}

// Weights made with other settings that shape the model (Note [shape
// settings]): the tensor that does not fit is named, then the flag, from the
// file's metadata; a file without it gets the tensor alone.
TEST_F(TrainerTest, WeightsOfOtherShapeSettingsNameTheFlag) {
  TempDir out;
  auto expect_named = [&](const TrainOptions& made, TrainOptions used, const std::string& line) {
    Trainer maker(made, nullptr);
    write_safetensors(out.file("w.safetensors"), state_of(maker), maker.weights_metadata());
    write_safetensors(out.file("bare.safetensors"), state_of(maker));
    for (const std::string name : {"w.safetensors", "bare.safetensors"}) {
      used.init_weights = out.file(name);
      try {
        Trainer t(used, nullptr);
        ADD_FAILURE() << "loaded weights that do not fit: " << line;
      } catch (const UsageError& e) {
        ADD_FAILURE() << "a usage error: " << e.what();
      } catch (const Error& e) {
        const std::string message = e.what();
        EXPECT_EQ(message.rfind("--init-weights: " + out.file(name) + ": tensor '", 0), 0u) << message;
        EXPECT_NE(message.find("' has shape"), std::string::npos) << message;
        EXPECT_EQ(message.find('\n'), std::string::npos) << message;  // one line
        EXPECT_EQ(message.find("; --") != std::string::npos, name == "w.safetensors") << message;
        if (name == "w.safetensors") EXPECT_NE(message.find("; " + line), std::string::npos) << message;
      }
    }
  };
  auto o = small_run(data_.path());  // 28 x 28 images
  auto larger = o;
  larger.image_size = 32;
  expect_named(o, larger,
               "--image-size: the weights were made for 28 x 28 images (their metadata), this run's model for "
               "32 x 32 images");
  auto resnet = o;
  resnet.model = "resnet18";
  resnet.stem = "imagenet";
  auto automatic = resnet;
  automatic.stem = "auto";  // cifar for 28 px
  expect_named(resnet, automatic,
               "--stem: the weights were made for the imagenet stem (their metadata), this run's model for the "
               "cifar stem");
  auto mobile = o;
  mobile.model = "mobilenetv2";
  mobile.width_mult = 0.5;
  auto wide = mobile;
  wide.width_mult = 1;
  expect_named(mobile, wide,
               "--width-mult: the weights were made for --width-mult 0.5 (their metadata), this run's model for "
               "--width-mult 1");
}

TEST_F(TrainerTest, InvalidOptionsNameTheFlag) {
  auto o = small_run(data_.path());
  o.warmup_epochs = 5;
  try {
    Trainer t(o, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "--warmup-epochs: expected [0, --epochs), got 5");
  }
  o = small_run(data_.path());
  o.device = "tpu";
  EXPECT_THROW(Trainer(o, nullptr), Error);
  o = small_run(data_.path());
  o.resume = true;
  EXPECT_THROW(Trainer(o, nullptr), Error);
  // Values that used to run, ignored or wrong (a black-box sweep's finds).
  auto with = [&](const std::function<void(TrainOptions&)>& change) {
    auto changed = small_run(data_.path());
    change(changed);
    return changed;
  };
  refused(with([](auto& c) { c.min_lr = 1; }),
          "--min-lr 1: expected 0 to --lr (0.05), where the cosine schedule ends; --lr is its peak");
  refused(with([](auto& c) { c.lr = 1e300; }), "--lr 1e+300: beyond the largest float32 (3.40282e+38)");
  refused(with([](auto& c) { c.clip_grad_norm = 1e39; }), "--clip-grad-norm 1e+39: beyond the largest float32");
  refused(with([](auto& c) { c.width_mult = 2; }), "--width-mult 2 applies to --model mobilenetv2 only, not convnet");
  refused(with([](auto& c) { c.stem = "cifar"; }), "--stem cifar applies to the resnet models only, not convnet");
  refused(with([](auto& c) {
            c.strategy = "pipeline";
            c.devices = "cpu,cpu";
            c.micro_batches = 65;
          }),
          "--micro-batches 65: more than the 64 samples of a batch (--batch-size 64)");
  refused(with([](auto& c) { c.image_size = 8193; }), "--image-size: expected 1 to 8192 pixels");
  // What the options alone show is a usage error (the CLI's exit 2), also
  // checked by `tandem train --nproc-per-node` before any worker starts.
  EXPECT_THROW(Trainer(with([](auto& c) { c.momentum = 1; }), nullptr), UsageError);
  EXPECT_THROW(check_train_options(with([](auto& c) { c.amp = "fp8"; })), UsageError);
  EXPECT_THROW(check_train_options(with([](auto& c) { c.profile_steps = "8:5"; })), UsageError);
  EXPECT_NO_THROW(check_train_ranks(small_run(data_.path()), 4));
  EXPECT_EQ(testing::error_of([&] { check_train_ranks(small_run(data_.path()), 3); }),
            "--batch-size 64: not divisible by the world size 3 (each data-parallel rank takes batch-size / 3 "
            "samples a step)");
  EXPECT_NO_THROW(check_train_ranks(with([](auto& c) { c.batch_per_process = 5; }), 3));
  EXPECT_EQ(testing::error_of([&] {
              check_train_ranks(with([](auto& c) {
                                  c.strategy = "pipeline";
                                  c.micro_batches = 65;
                                }), 2);
            }),
            "--micro-batches 65: more than the 64 samples of a batch (--batch-size 64); each micro-batch needs "
            "at least one");
  // --export-weights is checked when run() starts, before the first step.
  EXPECT_EQ(testing::error_of([&] { Trainer(with([](auto& c) { c.export_weights = "/no/such/folder/w.st"; }), nullptr).run(); }),
            "--export-weights /no/such/folder/w.st: /no/such/folder is not a folder this process can write to");
  EXPECT_EQ(testing::error_of([&] { Trainer(with([&](auto& c) { c.export_weights = data_.path(); }), nullptr).run(); }),
            "--export-weights " + data_.path() + ": is a folder; expected a file name");
  refused(with([&](auto& c) { c.metrics_out = "m-{rank}.jsonl"; }),
          "--metrics-out m-{rank}.jsonl: one file for the job (rank 0 writes the figures summed over the ranks); "
          "{rank} applies to --export-weights and --profile-out");
  // Two output flags on one file (the weights used to overwrite the metrics, exit 0).
  TempDir outputs;
  refused(with([&](auto& c) {
            c.metrics_out = outputs.file("same.out");
            c.export_weights = outputs.path() + "/./same.out";
          }),
          "--metrics-out " + outputs.file("same.out") + " and --export-weights " + outputs.path() +
              "/./same.out name the same file: each needs its own");
  refused(with([&](auto& c) {
            c.profile_out = outputs.file("t.json");
            c.export_weights = outputs.file("t.json");
          }),
          "--export-weights " + outputs.file("t.json") + " and --profile-out " + outputs.file("t.json") + " name the same file");
  // A device or FIFO would be replaced by the rename: refused, left as it was
  // (a copy of /dev/null made with mknod; --export-weights /dev/null, as
  // root, used to replace the system's). A link to a regular file is kept,
  // and the file it points to is written.
  TempDir special;
  const std::string null_copy = special.file("null"), fifo = special.file("fifo");
  ASSERT_EQ(::mknod(null_copy.c_str(), S_IFCHR | 0666, ::makedev(1, 3)), 0) << std::strerror(errno);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  for (const auto& path : {null_copy, fifo}) {
    auto o = with([&](auto& c) {
      c.export_weights = path;
      c.max_steps = 1;
    });
    EXPECT_EQ(testing::error_of([&] { Trainer(o, nullptr).run(); }),
              "--export-weights " + path + ": is " + (path == fifo ? "a FIFO" : "a character device") +
                  ", not a regular file; this file is written whole and renamed into place, which would replace "
                  "it: name a regular file");
    EXPECT_FALSE(std::filesystem::is_regular_file(path));
  }
  std::ofstream(special.file("real.st")) << "old";
  std::filesystem::create_symlink(special.file("real.st"), special.file("link.st"));
  Trainer(with([&](auto& c) {
            c.export_weights = special.file("link.st");
            c.max_steps = 1;
          }),
          nullptr)
      .run();
  EXPECT_TRUE(std::filesystem::is_symlink(special.file("link.st")));
  EXPECT_GT(std::filesystem::file_size(special.file("real.st")), 1000u);
}

// Note [loading in place]: a resumed run copies the checkpoint into the
// model's own tensors (the same storage before and after, so aliases such as
// DDP's gradient views hold) and ends with the weights that were saved. A
// run resumed at --max-steps trains no further and writes nothing new.
TEST_F(TrainerTest, ResumeLoadsIntoTheModelsOwnTensorsAndStopsAtMaxSteps) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.max_steps = 5;
  Trainer first(o, nullptr);
  first.run();
  o.resume = true;
  Trainer again(o, nullptr);
  std::vector<void*> storage, after;
  for (const auto& p : again.model()->parameters()) storage.push_back(p.data_ptr());
  auto result = again.run();
  for (const auto& p : again.model()->parameters()) after.push_back(p.data_ptr());
  EXPECT_EQ(storage, after);
  EXPECT_EQ(result.steps, 5);
  EXPECT_TRUE(result.epochs.empty());
  expect_equal_states(state_of(first), state_of(again));
  EXPECT_EQ(file_names(checkpoints.path()), (std::vector<std::string>{"checkpoint-00000005.pt"}));
}

// On a GPU, a checkpoint written on the CPU resumes onto the run's device.
TEST_F(TrainerTest, ResumesOntoTheGpuFromACheckpointWrittenOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.checkpoint_dir = checkpoints.path();
  o.max_steps = 5;
  Trainer(o, nullptr).run();  // on the CPU
  o.resume = true;
  o.device = "cuda:0";
  o.max_steps = 7;
  Trainer on_gpu(o, nullptr);
  EXPECT_EQ(on_gpu.run().steps, 7);
  for (const auto& p : on_gpu.model()->parameters()) EXPECT_TRUE(p.is_cuda());
}

// Checkpoints are pruned by step, so a fresh run into a directory holding an
// earlier run's later checkpoints would lose its own (and a restart would
// resume the old run): refused, naming the directory and the way out.
TEST_F(TrainerTest, AFreshRunRefusesADirectoryWithCheckpoints) {
  TempDir checkpoints;
  auto o = small_run(data_.path());
  o.epochs = 1;
  o.checkpoint_dir = checkpoints.path();
  Trainer(o, nullptr).run();
  Trainer fresh(o, nullptr);
  try {
    fresh.run();
    FAIL() << "a fresh run wrote into " << checkpoints.path();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), ("--checkpoint-dir " + checkpoints.path() +
                            " already holds checkpoints of an earlier run (newest: " +
                            checkpoints.file("checkpoint-00000008.pt") +
                            "); pass --resume to continue it, or give an empty or new directory")
                               .c_str());
  }
}

TEST_F(TrainerTest, OutOfRangeNumbersAreRefusedByName) {
  auto message = [&](auto change) {
    auto o = small_run(data_.path());
    change(o);
    try {
      Trainer t(o, nullptr);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("<no error>");
  };
  EXPECT_EQ(message([](TrainOptions& o) { o.workers = 5000; }), "--workers: expected 0 to 1024, got 5000");
  EXPECT_EQ(message([](TrainOptions& o) { o.dist_timeout = 1e16; }),
            "--dist-timeout: expected a positive number of seconds up to a week (604800), got 1e+16");
  EXPECT_EQ(message([](TrainOptions& o) { o.bucket_cap_mb = 1e30; }),
            "--bucket-cap-mb: expected a positive size up to 1e6 MiB, got 1e+30");
}

}  // namespace
}  // namespace tandem::engine
