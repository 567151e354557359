// The Trainer's tools: the profiler's window, warnings, clipping, CUDA graphs.
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
  o.progress = ProgressMode::kOff;
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
  EXPECT_TRUE(observe::StepProfiler({out.file("t.json")}, 0).enabled());
  EXPECT_FALSE(observe::StepProfiler({out.file("t.json")}, 1).enabled());
  EXPECT_FALSE(observe::StepProfiler({""}, 0).enabled());
  observe::StepProfiler third({out.file("t-{rank}.json")}, 3);
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
      {"float64", [](TrainOptions& c) { c.dtype = Dtype::kFloat64; }, 1e-5},
      {"float32", [](TrainOptions&) {}, 1e-4},
      {"--amp fp16", [](TrainOptions& c) { c.amp = AmpMode::kFp16; }, 1e-3},
      {"--grad-accum 4", [](TrainOptions& c) { c.grad_accum = 4; }, 1e-4},
      {"--strategy dp", [](TrainOptions& c) { c.strategy = Strategy::kDp; c.devices = "cpu,cpu"; }, 1e-4},
      {"--strategy pipeline", [](TrainOptions& c) { c.strategy = Strategy::kPipeline; c.devices = "cpu,cpu"; }, 1e-4},
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
  fp16.amp = AmpMode::kFp16;
  refused(fp16, "--cuda-graph does not work with --amp fp16");
  auto dp = o;
  dp.strategy = Strategy::kDp;
  dp.devices = "cuda:0,cuda:0";
  refused(dp, "--cuda-graph captures the step of one process on one device");
  auto fsdp = o;
  fsdp.strategy = Strategy::kFsdp;  // its gathers and reductions are collectives on the host's schedule
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

}  // namespace
}  // namespace tandem::engine
