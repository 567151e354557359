// Pipeline parallelism on repeated CPU devices: stage splits, a model split
// over devices (seed 003), and GPipe / 1F1B / interleaved 1F1B in one
// process (threads) and over ranks (Gloo on 127.0.0.1) against no pipeline.
#include <gtest/gtest.h>

#include <atomic>

#include <chrono>
#include <random>
#include <set>
#include <thread>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/torch.h>

#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/parallel/model_parallel.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/parallel/stage_split.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::parallel {
namespace {

using testing::error_of;

std::vector<torch::Device> cpus(size_t n) { return std::vector<torch::Device>(n, torch::kCPU); }

// BatchNorm-free, so micro-batches change nothing but rounding.
models::Sequence small_convnet() {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("conv1", nn::Conv2d(nn::Conv2dOptions(1, 4, 3).padding(1)));
  net->push_back("relu1", nn::ReLU());
  net->push_back("pool", nn::MaxPool2d(2));
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc1", nn::Linear(4 * 4 * 4, 16));
  net->push_back("relu2", nn::ReLU());
  net->push_back("fc2", nn::Linear(16, 5));
  return net;
}

// An identity that counts its forwards (from any stage thread).
struct ForwardCountImpl : torch::nn::Module {
  std::atomic<int> calls{0};
  torch::Tensor forward(torch::Tensor x) {
    ++calls;
    return x;
  }
};
TORCH_MODULE(ForwardCount);

models::Sequence copy_of(const models::Sequence& net) {
  return std::dynamic_pointer_cast<models::SequenceImpl>(net->clone());
}

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

// max |a - b| / max(|b|, 1e-3) over each pair of gradients.
void expect_same_gradients(torch::nn::Module& got, torch::nn::Module& want, double tolerance,
                           const std::string& what) {
  auto g = got.named_parameters(), w = want.named_parameters();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ASSERT_TRUE(g[i].value().grad().defined()) << what << ": " << g[i].key();
    // On the CPU: the two may live on different devices (model parallelism).
    auto diff = (g[i].value().grad().cpu() - w[i].value().grad().cpu()).abs().max().item<double>();
    auto scale = std::max(w[i].value().grad().abs().max().item<double>(), 1e-3);
    EXPECT_LE(diff / scale, tolerance) << what << ": " << g[i].key();
  }
}

// --- splits ------------------------------------------------------------------

TEST(StageSplitTest, BalanceMinimisesTheLargestStage) {
  EXPECT_EQ(balance_stages({1, 1, 1, 1}, 2), (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(balance_stages({4, 1, 1, 1, 1}, 2), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(balance_stages({1, 2, 3, 4, 5, 6, 7, 8, 9}, 3), (std::vector<int64_t>{5, 2, 2}));
  // Every stage gets a layer even when costs are zero; ties go to earlier stages.
  EXPECT_EQ(balance_stages({0, 0, 0, 5}, 3), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(balance_stages({3}, 1), (std::vector<int64_t>{1}));
  EXPECT_NE(error_of([] { balance_stages({1, 1}, 3); }).find("fewer than the 3 stages"),
            std::string::npos);
}

// Brute force over every split of up to 8 layers into up to 4 stages.
TEST(StageSplitTest, BalanceIsOptimalAgainstBruteForce) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    int n = 1 + trial % 8, stages = 1 + (trial / 8) % std::min(n, 4);
    std::vector<double> costs;
    for (int i = 0; i < n; ++i) costs.push_back(static_cast<double>(rng() % 10));
    double best = 1e300;
    for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {  // bit i: a cut after layer i
      if (__builtin_popcount(mask) != stages - 1) continue;
      double largest = 0, sum = 0;
      for (int i = 0; i < n; ++i) {
        sum += costs[i];
        if (i == n - 1 || (mask >> i & 1)) {
          largest = std::max(largest, sum);
          sum = 0;
        }
      }
      best = std::min(best, largest);
    }
    auto sizes = balance_stages(costs, stages);
    ASSERT_EQ(static_cast<int>(sizes.size()), stages);
    double largest = 0;
    size_t next = 0;
    for (auto size : sizes) {
      ASSERT_GT(size, 0);
      double sum = 0;
      for (int64_t k = 0; k < size; ++k) sum += costs[next++];
      largest = std::max(largest, sum);
    }
    EXPECT_EQ(next, costs.size());
    EXPECT_EQ(largest, best) << "trial " << trial;
  }
}

// Interleaved: the largest per-stage total (pieces k, k + S, ... on stage
// k % S), then the largest piece, are the smallest over every split of up
// to 10 layers into S * V pieces.
TEST(StageSplitTest, InterleavedBalanceIsOptimalAgainstBruteForce) {
  std::mt19937 rng(9);
  auto score = [](const std::vector<double>& costs, const std::vector<int64_t>& sizes, int64_t stages) {
    std::vector<double> loads(stages, 0.0);
    double piece = 0;
    size_t next = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      double sum = 0;
      for (int64_t j = 0; j < sizes[k]; ++j) sum += costs.at(next++);
      loads[k % stages] += sum;
      piece = std::max(piece, sum);
    }
    EXPECT_EQ(next, costs.size());
    return std::make_pair(*std::max_element(loads.begin(), loads.end()), piece);
  };
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t stages = 2 + trial % 2, chunks = 2 + (trial / 2) % 2;
    const int n = static_cast<int>(stages * chunks) + static_cast<int>(rng() % 5);
    std::vector<double> costs;
    for (int i = 0; i < n; ++i) costs.push_back(static_cast<double>(rng() % 10));
    std::pair<double, double> best{1e300, 1e300};
    for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {  // bit i: a cut after layer i
      if (__builtin_popcount(mask) != stages * chunks - 1) continue;
      std::vector<int64_t> sizes;
      int64_t run = 0;
      for (int i = 0; i < n; ++i) {
        ++run;
        if (i == n - 1 || (mask >> i & 1)) {
          sizes.push_back(run);
          run = 0;
        }
      }
      best = std::min(best, score(costs, sizes, stages));
    }
    auto sizes = balance_interleaved(costs, stages, chunks);
    ASSERT_EQ(static_cast<int64_t>(sizes.size()), stages * chunks);
    for (auto size : sizes) ASSERT_GT(size, 0);
    EXPECT_EQ(score(costs, sizes, stages), best) << "trial " << trial;
  }
}

// Balancing the pieces alone can load one stage three times as much as the
// other: balance_stages cuts 1+3+1 | 1+1 | 5 | 1, stage loads 10 and 3;
// the interleaved balance 1 | 3+1+1 | 1+5 | 1, stage loads 7 and 6.
TEST(StageSplitTest, InterleavedBalanceEvensTheStagesNotThePieces) {
  const std::vector<double> costs = {1, 3, 1, 1, 1, 5, 1};
  EXPECT_EQ(balance_stages(costs, 4), (std::vector<int64_t>{3, 2, 1, 1}));
  EXPECT_EQ(balance_interleaved(costs, 2, 2), (std::vector<int64_t>{1, 3, 2, 1}));
  EXPECT_EQ(balance_interleaved(costs, 2, 1), balance_stages(costs, 2));
  // With no search budget the start, balance_stages' split, stands.
  EXPECT_EQ(balance_interleaved(costs, 2, 2, 0), balance_stages(costs, 4));
  EXPECT_NE(error_of([] { balance_interleaved({1, 1, 1}, 2, 2); }).find("fewer than the 4 stages"),
            std::string::npos);
}

TEST(StageSplitTest, ExplicitSplitByLayerNames) {
  auto net = small_convnet();
  EXPECT_EQ(split_at_names(net, "fc1", 2), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(split_at_names(net, "pool,fc2", 3), (std::vector<int64_t>{2, 4, 1}));
  EXPECT_EQ(describe_split(net, {2, 4, 1}), "conv1..relu1 | pool..relu2 | fc2");
  EXPECT_NE(error_of([&] { split_at_names(net, "fc9", 2); }).find("no layer 'fc9' in the model (its layers: conv1, relu1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { split_at_names(net, "fc1,pool", 3); }).find("does not come after"),
            std::string::npos);
  EXPECT_NE(error_of([&] { split_at_names(net, "conv1", 2); }).find("does not come after"),
            std::string::npos);
  EXPECT_NE(error_of([&] { split_at_names(net, "fc1", 3); }).find("expected 2 name(s)"),
            std::string::npos);
}

TEST(StageSplitTest, CostsByParametersAndByTime) {
  auto net = small_convnet();
  EXPECT_EQ(parameter_costs(net), (std::vector<double>{40, 0, 0, 0, 64 * 16 + 16, 0, 16 * 5 + 5}));
  // Measuring runs a copy: the model's weights, gradients and mode are untouched.
  auto before = copy_of(net);
  auto costs = measured_costs(net, torch::randn({8, 1, 8, 8}), {2, 2, 0.0});
  ASSERT_EQ(costs.size(), net->size());
  for (double c : costs) EXPECT_GE(c, 0.0);
  for (const auto& p : net->named_parameters()) {
    EXPECT_FALSE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(torch::equal(p.value(), before->named_parameters()[p.key()])) << p.key();
  }
}

// Records whether its input needs a gradient; the log is shared by clones.
struct GradProbeImpl : torch::nn::Cloneable<GradProbeImpl> {
  explicit GradProbeImpl(std::shared_ptr<std::vector<bool>> log) : log(std::move(log)) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    log->push_back(x.requires_grad());
    return x * 1;
  }
  std::shared_ptr<std::vector<bool>> log;
};
TORCH_MODULE(GradProbe);

// Each child is timed with its input needing a gradient exactly when it
// would in training: not the data, and not behind layers without weights.
TEST(StageSplitTest, MeasuredCostsAskForInputGradientsAsTrainingDoes) {
  namespace nn = torch::nn;
  auto first = std::make_shared<std::vector<bool>>();
  auto second = std::make_shared<std::vector<bool>>();
  auto third = std::make_shared<std::vector<bool>>();
  models::Sequence net;
  net->push_back("probe1", GradProbe(first));
  net->push_back("flatten", nn::Flatten());
  net->push_back("probe2", GradProbe(second));
  net->push_back("fc", nn::Linear(16, 4));
  net->push_back("probe3", GradProbe(third));
  auto costs = measured_costs(net, torch::randn({2, 1, 4, 4}), {2, 2, 0.0});
  ASSERT_EQ(costs.size(), 5u);
  EXPECT_EQ(*first, (std::vector<bool>{false, false, false}));  // a warm-up pass and two timed
  EXPECT_EQ(*second, (std::vector<bool>{false, false, false}));
  EXPECT_EQ(*third, (std::vector<bool>{true, true, true}));
}

// The least time of each child is kept: a pass slowed by other work does
// not make its layers look heavier.
struct SlowTwiceImpl : torch::nn::Cloneable<SlowTwiceImpl> {
  explicit SlowTwiceImpl(std::shared_ptr<int> calls) : calls(std::move(calls)) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    // The warm-up and the first timed pass are slow, the second is not.
    if ((*calls)++ < 2) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    return x * 1;
  }
  std::shared_ptr<int> calls;
};
TORCH_MODULE(SlowTwice);

TEST(StageSplitTest, MeasuredCostsKeepTheFastestPass) {
  models::Sequence net;
  net->push_back("slow", SlowTwice(std::make_shared<int>(0)));
  auto costs = measured_costs(net, torch::randn({2, 3}), {2, 2, 0.0});
  ASSERT_EQ(costs.size(), 1u);
  EXPECT_LT(costs[0], 0.1);
}

// Counts its forwards; the count is shared by clones.
struct CountCallsImpl : torch::nn::Cloneable<CountCallsImpl> {
  explicit CountCallsImpl(std::shared_ptr<int> calls) : calls(std::move(calls)) {}
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    ++*calls;
    return x * 1;
  }
  std::shared_ptr<int> calls;
};
TORCH_MODULE(CountCalls);

// A cheap model gets passes up to max_repeats while the budget lasts; with
// no budget it gets min_repeats; bad counts are named.
TEST(StageSplitTest, MeasuredCostsRepeatWhileTheBudgetLasts) {
  auto calls = std::make_shared<int>(0);
  models::Sequence net;
  net->push_back("count", CountCalls(calls));
  measured_costs(net, torch::randn({2, 3}), {2, 6, 60.0});
  EXPECT_EQ(*calls, 1 + 6);  // the warm-up and max_repeats timed passes
  *calls = 0;
  measured_costs(net, torch::randn({2, 3}), {2, 6, 0.0});
  EXPECT_EQ(*calls, 1 + 2);
  *calls = 0;
  measured_costs(net, torch::randn({2, 3}));  // the defaults: 20 passes of a cheap model
  EXPECT_EQ(*calls, 1 + MeasureOptions{}.max_repeats);
  EXPECT_NE(error_of([&] { measured_costs(net, torch::randn({2, 3}), {0, 6, 1.0}); })
                .find("expected 1 <= min_repeats <= max_repeats, got 0 and 6"),
            std::string::npos);
  EXPECT_NE(error_of([&] { measured_costs(net, torch::randn({2, 3}), {3, 2, 1.0}); })
                .find("expected 1 <= min_repeats <= max_repeats, got 3 and 2"),
            std::string::npos);
  EXPECT_NE(error_of([&] { measured_costs(net, torch::randn({2, 3}), {1, 2, -1.0}); })
                .find("expected a budget >= 0 seconds, got -1"),
            std::string::npos);
}

TEST(StageSplitTest, StagesShareTheModelsParameters) {
  auto net = small_convnet();
  auto stages = split_sequence(net, {4, 3});
  ASSERT_EQ(stages.size(), 2u);
  EXPECT_EQ(stages[1]->named_parameters().keys(),
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}));
  EXPECT_TRUE(stages[1]->named_parameters()["fc2.weight"].is_same(net->named_parameters()["fc2.weight"]));
  EXPECT_NE(error_of([&] { split_sequence(net, {4, 2}); }).find("the stages hold 6 layers but the model has 7"),
            std::string::npos);
}

// --- seed 003: a model whose parts live on different devices -----------------

// An embedding computed on one device, the rest on another: outputs and
// gradients equal the unsplit model's within `tolerance`, and training
// moves along.
void check_embedding_on_one_device_the_rest_on_another(std::vector<torch::Device> devices, double tolerance) {
  torch::manual_seed(3);
  models::Sequence net;
  net->push_back("embedding", torch::nn::Embedding(1000, 10));
  net->push_back("rnn", torch::nn::Linear(10, 10));
  auto whole = copy_of(net);
  ModelParallel split(split_sequence(net, {1, 1}), devices);
  EXPECT_EQ(split->stages()[1]->parameters()[0].device(), devices[1]);
  torch::optim::SGD sgd_split(split->parameters(), 0.5), sgd_whole(whole->parameters(), 0.5);
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randint(1000, {16, 5}, torch::kInt64);
    auto out_split = split->forward(x);
    auto out_whole = whole->forward(x);
    EXPECT_EQ(out_split.device(), devices[1]);
    EXPECT_TRUE(torch::allclose(out_split.cpu(), out_whole, tolerance, tolerance));
    sgd_split.zero_grad();
    sgd_whole.zero_grad();
    out_split.pow(2).mean().backward();
    out_whole.pow(2).mean().backward();
    expect_same_gradients(*split, *whole, tolerance, "step " + std::to_string(step));
    sgd_split.step();
    sgd_whole.step();
  }
  EXPECT_NE(error_of([&] { ModelParallel(split_sequence(net, {1, 1}), cpus(3)); })
                .find("2 stages but 3 devices"),
            std::string::npos);
}

// On two CPUs it is exact.
TEST(ModelParallelTest, EmbeddingOnOneDeviceTheRestOnAnother) {
  check_embedding_on_one_device_the_rest_on_another({torch::kCPU, torch::kCPU}, 1e-6);
}

// The rest on cuda:0: another device's arithmetic rounds differently, so
// within 1e-5.
TEST(ModelParallelTest, EmbeddingOnTheCpuTheRestOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_embedding_on_one_device_the_rest_on_another({torch::kCPU, torch::Device(torch::kCUDA, 0)}, 1e-5);
}

// --- one process, one thread per stage ---------------------------------------

struct PipelineCase {
  std::vector<int64_t> sizes;
  int64_t micro_batches;
  std::string schedule;
};

// GPipe and 1F1B give the loss and gradients of no pipeline within
// `tolerance`, for 2 and 3 stages and micro-batch counts that do and do not
// divide the batch, every stage and the unsplit model on `place`; the
// outputs come back in the batch's order.
void check_schedules_equal_no_pipeline(torch::Device place, double tolerance) {
  const std::vector<PipelineCase> cases = {
      {{4, 3}, 1, "gpipe"}, {{4, 3}, 4, "gpipe"}, {{4, 3}, 4, "1f1b"}, {{2, 3, 2}, 3, "1f1b"},
      {{2, 3, 2}, 5, "gpipe"}, {{1, 1, 3, 2}, 8, "1f1b"}, {{4, 3}, 16, "1f1b"}};
  for (const auto& c : cases) {
    std::string what = describe_split(small_convnet(), c.sizes) + " " + c.schedule + " m=" +
                       std::to_string(c.micro_batches) + " on " + place.str();
    torch::manual_seed(11);
    auto net = small_convnet();
    auto reference = copy_of(net);
    reference->to(place);
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    Pipeline pipe(net, c.sizes, std::vector<torch::Device>(c.sizes.size(), place),
                  {c.micro_batches, c.schedule});
    auto step = pipe.train_step(x.to(place), y.to(place), cross_entropy);
    auto out = reference->forward(x.to(place));
    auto loss = cross_entropy(out, y.to(place));
    loss.backward();
    EXPECT_EQ(step.micro_batches, std::min<int64_t>(c.micro_batches, 12)) << what;
    EXPECT_NEAR(step.loss.item<double>(), loss.item<double>(), tolerance * loss.item<double>()) << what;
    EXPECT_TRUE(torch::allclose(step.output.cpu(), out.detach().cpu(), tolerance, tolerance / 10)) << what;
    expect_same_gradients(*net, *reference, tolerance, what);
  }
}

// On the CPU within 1e-5.
TEST(PipelineTest, SchedulesEqualNoPipeline) { check_schedules_equal_no_pipeline(torch::kCPU, 1e-5); }

// Every stage on cuda:0 (issue 5's cuda:0,cuda:0 check) against the unsplit
// model on cuda:0: the same kernels, other batch sizes, so within 1e-4.
TEST(PipelineTest, SchedulesEqualNoPipelineOnOneGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_schedules_equal_no_pipeline(torch::Device(torch::kCUDA, 0), 1e-4);
}

// Interleaved 1F1B: S devices, V chunks each (the model cut into S * V
// pieces, piece k on device k % S) give the loss, outputs and gradients of
// no pipeline within `tolerance`, for micro-batch counts that are and are
// not multiples of S; each stage ran its schedule's actions in order and
// held no more chunk-micro-batches than the schedule says. Every device and
// the unsplit model are `place`.
void check_interleaved_equals_no_pipeline(torch::Device place, double tolerance) {
  struct Case {
    std::vector<int64_t> sizes;
    int64_t devices, micro_batches;
  };
  const std::vector<Case> cases = {{{2, 2, 2, 1}, 2, 4}, {{2, 2, 2, 1}, 2, 3}, {{1, 1, 2, 1, 1, 1}, 3, 6},
                                   {{1, 1, 2, 1, 1, 1}, 2, 5}, {{3, 2, 2}, 1, 4}};
  for (const auto& c : cases) {
    const int64_t chunks = static_cast<int64_t>(c.sizes.size()) / c.devices;
    std::string what = describe_split(small_convnet(), c.sizes) + " over " + std::to_string(c.devices) +
                       " devices, m=" + std::to_string(c.micro_batches) + " on " + place.str();
    torch::manual_seed(17);
    auto net = small_convnet();
    auto reference = copy_of(net);
    reference->to(place);
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    PipelineOptions options{c.micro_batches, "interleaved"};
    options.virtual_stages = chunks;
    Pipeline pipe(net, c.sizes, std::vector<torch::Device>(c.devices, place), options);
    ASSERT_EQ(pipe.devices().size(), static_cast<size_t>(c.devices));
    ASSERT_EQ(pipe.pieces().size(), c.sizes.size());
    auto step = pipe.train_step(x.to(place), y.to(place), cross_entropy);
    auto out = reference->forward(x.to(place));
    auto loss = cross_entropy(out, y.to(place));
    loss.backward();
    EXPECT_NEAR(step.loss.item<double>(), loss.item<double>(), tolerance * loss.item<double>()) << what;
    EXPECT_TRUE(torch::allclose(step.output.cpu(), out.detach().cpu(), tolerance, tolerance / 10)) << what;
    expect_same_gradients(*net, *reference, tolerance, what);
    auto plan = interleaved_schedule(c.devices, c.micro_batches, chunks);
    auto sim = simulate(plan);
    ASSERT_EQ(step.stages.size(), static_cast<size_t>(c.devices));
    for (int64_t s = 0; s < c.devices; ++s) {
      EXPECT_EQ(step.stages[s].actions, plan.actions[s]) << what << " stage " << s;
      EXPECT_EQ(step.stages[s].max_in_flight, sim.max_in_flight[s]) << what << " stage " << s;
    }
    // Evaluation runs the whole batch through the pieces in model order.
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(pipe.forward(x.to(place)).cpu(), out.detach().cpu(), tolerance,
                                tolerance / 10)) << what;
  }
}

// On the CPU within 1e-5.
TEST(PipelineTest, InterleavedEqualsNoPipeline) { check_interleaved_equals_no_pipeline(torch::kCPU, 1e-5); }

// Every device cuda:0: the same kernels, other batch sizes, so within 1e-4.
TEST(PipelineTest, InterleavedEqualsNoPipelineOnOneGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_interleaved_equals_no_pipeline(torch::Device(torch::kCUDA, 0), 1e-4);
}

// A batch that requires grad gets its gradient, as from the unsplit model:
// a leaf batch in its .grad, and a batch computed by an upstream layer in
// that layer's parameters (one backward through the upstream graph, which
// frees its saved tensors after the first pass). Threads and two ranks.
TEST(PipelineTest, TheBatchsGradientReachesTheCallersGraph) {
  torch::manual_seed(23);
  auto net = small_convnet();
  auto upstream = torch::nn::Linear(16, 64);
  auto z = torch::randn({12, 16});
  auto y = torch::randint(5, {12}, torch::kInt64);
  auto reference = copy_of(net);
  auto reference_up = std::dynamic_pointer_cast<torch::nn::LinearImpl>(upstream->clone());
  auto leaf = torch::randn({12, 1, 8, 8}).requires_grad_(true);
  auto leaf_ref = leaf.detach().clone().requires_grad_(true);
  cross_entropy(reference->forward(reference_up->forward(z).view({12, 1, 8, 8})), y).backward();
  cross_entropy(reference->forward(leaf_ref), y).backward();
  for (std::string schedule : {"gpipe", "1f1b"}) {
    net->zero_grad();
    upstream->zero_grad();
    leaf.mutable_grad() = torch::Tensor();
    Pipeline pipe(net, {3, 4}, cpus(2), {4, schedule});
    pipe.train_step(upstream->forward(z).view({12, 1, 8, 8}), y, cross_entropy);
    pipe.train_step(leaf, y, cross_entropy);
    expect_same_gradients(*net, *reference, 1e-5, schedule);
    expect_same_gradients(*upstream, *reference_up, 1e-5, schedule + " upstream");
    ASSERT_TRUE(leaf.grad().defined()) << schedule;
    EXPECT_TRUE(torch::allclose(leaf.grad(), leaf_ref.grad(), 1e-5, 1e-7)) << schedule;
  }
  // Over two ranks: rank 0 holds the upstream layer and the first stage.
  auto copies = std::vector<models::Sequence>{copy_of(net), copy_of(net)};
  upstream->zero_grad();
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    auto stage = split_sequence(copies[r], {3, 4})[r];
    DistributedPipeline pipe(stage, torch::kCPU, group, {4, "1f1b"});
    for (auto& p : stage->parameters()) p.mutable_grad() = torch::Tensor();
    pipe.train_step(r == 0 ? upstream->forward(z).view({12, 1, 8, 8}) : torch::Tensor(),
                    r == 1 ? y : torch::Tensor(), cross_entropy);
  }));
  expect_same_gradients(*upstream, *reference_up, 1e-5, "two ranks upstream");
}

// Gradients accumulate across steps like any backward; an optimizer step
// after each keeps pipeline and reference together.
TEST(PipelineTest, TrainingStepsEqualNoPipeline) {
  torch::manual_seed(5);
  auto net = small_convnet();
  auto reference = copy_of(net);
  Pipeline pipe(net, {3, 4}, cpus(2), {4, "1f1b"});
  torch::optim::SGD a(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD b(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({10, 1, 8, 8});
    auto y = torch::randint(5, {10}, torch::kInt64);
    a.zero_grad();
    b.zero_grad();
    pipe.train_step(x, y, cross_entropy);
    cross_entropy(reference->forward(x), y).backward();
    a.step();
    b.step();
  }
  for (const auto& p : net->named_parameters()) {
    auto want = reference->named_parameters()[p.key()];
    EXPECT_TRUE(torch::allclose(p.value(), want, 1e-5, 1e-6)) << p.key();
  }
  // forward(): the whole batch through the stages, as the unsplit model.
  auto x = torch::randn({6, 1, 8, 8});
  EXPECT_TRUE(torch::allclose(pipe.forward(x), reference->forward(x), 1e-5, 1e-6));
}

// --amp in a pipeline: each stage's forward ran under bf16 autocast (the
// last stage's output is bf16), backward outside it, and the gradients agree
// with the unsplit model under the same autocast to bf16's precision; in one
// process and over two ranks.
TEST(PipelineTest, AutocastRunsEachMicroBatchForwardInBf16) {
  torch::manual_seed(17);
  auto net = small_convnet();
  auto reference = copy_of(net);
  auto x = torch::randn({12, 1, 8, 8});
  auto y = torch::randint(5, {12}, torch::kInt64);
  torch::Tensor want;
  {
    optim::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    want = cross_entropy(reference->forward(x), y);
  }
  want.backward();
  for (std::string schedule : {"gpipe", "1f1b"}) {
    auto mine = copy_of(net);
    Pipeline pipe(mine, {3, 4}, cpus(2), {3, schedule, torch::kBFloat16});
    auto step = pipe.train_step(x, y, cross_entropy);
    EXPECT_EQ(step.output.scalar_type(), torch::kBFloat16) << schedule;
    EXPECT_EQ(step.loss.scalar_type(), torch::kFloat32) << schedule;  // losses autocast to float32
    EXPECT_NEAR(step.loss.item<double>(), want.item<double>(), 2e-2 * want.item<double>()) << schedule;
    for (const auto& p : mine->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
    expect_same_gradients(*mine, *reference, 5e-2, "bf16 " + schedule);
  }
  std::vector<models::Sequence> copies{copy_of(net), copy_of(net)};
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    DistributedPipeline pipe(split_sequence(copies[r], {3, 4})[r], torch::kCPU, group,
                             {3, "1f1b", torch::kBFloat16});
    auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == 1 ? y : torch::Tensor(), cross_entropy);
    EXPECT_NEAR(step.loss.item<double>(), want.item<double>(), 2e-2 * want.item<double>()) << "rank " << r;
    if (r == 1) EXPECT_EQ(step.output.scalar_type(), torch::kBFloat16);
  }));
  for (int r = 0; r < 2; ++r) {
    expect_same_gradients(*split_sequence(copies[r], {3, 4})[r], *split_sequence(reference, {3, 4})[r],
                          5e-2, "bf16 over ranks, stage " + std::to_string(r));
  }
}

// PipelineOptions::recompute (GPipe's re-materialization): every stage
// keeps only its micro-batches' inputs and recomputes the forward before
// the backward, under the same autocast: the loss and the gradients of the
// step without it, bit for bit, with either schedule, in float32 and bf16,
// in one process and over 2 ranks.
TEST(PipelineTest, RecomputingStagesGiveTheSameStepBitForBit) {
  torch::manual_seed(29);
  auto net = small_convnet();
  auto x = torch::randn({12, 1, 8, 8});
  auto y = torch::randint(5, {12}, torch::kInt64);
  auto expect_same_step = [](const models::Sequence& a, const models::Sequence& b, const torch::Tensor& loss_a,
                             const torch::Tensor& loss_b, const std::string& what) {
    EXPECT_TRUE(torch::equal(loss_a, loss_b)) << what;
    auto got = a->named_parameters(), want = b->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].value().grad(), want[i].value().grad())) << what << ": " << got[i].key();
    }
  };
  for (std::string schedule : {"gpipe", "1f1b"}) {
    for (std::optional<torch::ScalarType> autocast : {std::optional<torch::ScalarType>(), std::optional(torch::kBFloat16)}) {
      const std::string what = schedule + (autocast ? " bf16" : " float32");
      auto plain = copy_of(net), recomputed = copy_of(net);
      PipelineOptions options{4, schedule, autocast};
      Pipeline plain_pipe(plain, {3, 4}, cpus(2), options);
      options.recompute = true;
      Pipeline recomputing_pipe(recomputed, {3, 4}, cpus(2), options);
      auto a = plain_pipe.train_step(x, y, cross_entropy), b = recomputing_pipe.train_step(x, y, cross_entropy);
      expect_same_step(plain, recomputed, a.loss, b.loss, what);
    }
  }
  std::vector<models::Sequence> plain{copy_of(net), copy_of(net)}, recomputed{copy_of(net), copy_of(net)};
  std::vector<torch::Tensor> losses(4);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    for (bool recompute : {false, true}) {
      auto& copies = recompute ? recomputed : plain;
      PipelineOptions options{3, "1f1b"};
      options.recompute = recompute;
      DistributedPipeline pipe(split_sequence(copies[r], {3, 4})[r], torch::kCPU, group, options);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == 1 ? y : torch::Tensor(), cross_entropy);
      if (r == 1) losses[recompute] = step.loss;
    }
  }));
  for (int r = 0; r < 2; ++r) {
    expect_same_step(split_sequence(plain[r], {3, 4})[r], split_sequence(recomputed[r], {3, 4})[r], losses[0],
                     losses[1], "over 2 ranks, stage " + std::to_string(r));
  }
  // And the recomputation happens: each stage's forward runs twice per
  // micro-batch (a counting identity at the head of each stage).
  for (bool recompute : {false, true}) {
    models::Sequence counted;
    ForwardCount first, second;
    counted->push_back("count1", first);
    counted->push_back("fc1", torch::nn::Linear(4, 4));
    counted->push_back("count2", second);
    counted->push_back("fc2", torch::nn::Linear(4, 5));
    PipelineOptions options{3, "gpipe"};
    options.recompute = recompute;
    Pipeline pipe(counted, {2, 2}, cpus(2), options);
    pipe.train_step(torch::randn({6, 4}), torch::randint(5, {6}, torch::kInt64), cross_entropy);
    EXPECT_EQ(first->calls.load(), recompute ? 6 : 3);
    EXPECT_EQ(second->calls.load(), recompute ? 6 : 3);
  }
}

// A loss scale (fp16's GradScaler) multiplies what backward starts from, not
// the reported loss: with a power of two every gradient is exactly that
// multiple of the unscaled one.
TEST(PipelineTest, ALossScaleScalesEveryGradientExactly) {
  torch::manual_seed(19);
  auto net = small_convnet();
  auto scaled = copy_of(net);
  auto x = torch::randn({10, 1, 8, 8});
  auto y = torch::randint(5, {10}, torch::kInt64);
  Pipeline plain(net, {3, 4}, cpus(2), {4, "1f1b"});
  Pipeline pipe(scaled, {3, 4}, cpus(2), {4, "1f1b"});
  auto a = plain.train_step(x, y, cross_entropy);
  auto b = pipe.train_step(x, y, cross_entropy, [](const torch::Tensor& loss) { return loss * 1024; });
  EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>());
  auto want = net->named_parameters();
  for (const auto& p : scaled->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().grad(), want[p.key()].grad() * 1024)) << p.key();
  }
}

// Measured on the running executor, not the simulation: 1F1B holds at most
// S - s micro-batches on stage s (never more than the number of stages);
// GPipe holds all M. Each stage ran every F and B once, in schedule order.
TEST(PipelineTest, MicroBatchesInFlightPerStage) {
  for (std::string schedule : {"1f1b", "gpipe"}) {
    auto net = small_convnet();
    Pipeline pipe(net, {1, 2, 2, 2}, cpus(4), {8, schedule});
    auto step = pipe.train_step(torch::randn({16, 1, 8, 8}), torch::randint(5, {16}, torch::kInt64),
                                cross_entropy);
    auto plan = make_pipeline_schedule(schedule, 4, 8);
    ASSERT_EQ(step.stages.size(), 4u);
    for (int64_t s = 0; s < 4; ++s) {
      const auto& trace = step.stages[s];
      EXPECT_EQ(trace.actions, plan.actions[s]) << schedule << " stage " << s;
      EXPECT_EQ(trace.max_in_flight, schedule == "1f1b" ? 4 - s : 8) << schedule << " stage " << s;
      for (size_t k = 0; k < trace.start.size(); ++k) {
        EXPECT_LE(trace.start[k], trace.end[k]);
        if (k > 0) EXPECT_LE(trace.end[k - 1], trace.start[k]);
      }
    }
    // F(i) on stage s + 1 begins after F(i) on stage s ended.
    for (int64_t s = 0; s + 1 < 4; ++s) {
      for (size_t k = 0; k < step.stages[s + 1].actions.size(); ++k) {
        const auto& a = step.stages[s + 1].actions[k];
        if (a.op != PipelineOp::kForward) continue;
        for (size_t j = 0; j < step.stages[s].actions.size(); ++j) {
          if (step.stages[s].actions[j] == a) EXPECT_LE(step.stages[s].end[j], step.stages[s + 1].start[k]);
        }
      }
    }
    for (double idle : step.idle_share()) {
      EXPECT_GE(idle, 0.0);
      EXPECT_LT(idle, 1.0);
    }
  }
}

// A stage that throws stops the others (no hang) and its error comes back
// naming the stage and its device.
TEST(PipelineTest, AFailingStageEndsTheStepWithItsError) {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("fc1", nn::Linear(6, 8));
  net->push_back("fc2", nn::Linear(7, 3));  // wrong input width: fails on stage 1
  Pipeline pipe(net, {1, 1}, cpus(2), {4, "1f1b"});
  auto message = error_of([&] {
    pipe.train_step(torch::randn({8, 6}), torch::randint(3, {8}, torch::kInt64), cross_entropy);
  });
  EXPECT_NE(message.find("pipeline stage 1 (cpu): "), std::string::npos) << message;
  EXPECT_NE(message.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << message;
}

// Note [spinning hand-offs]: a stage that polls for its input and one that
// sleeps on it run the same arithmetic in the same order, so the two give
// bit-identical losses and gradients.
TEST(PipelineTest, PollingAndSleepingHandOffsGiveTheSameStep) {
  std::vector<torch::Tensor> losses;
  std::vector<models::Sequence> nets;
  for (auto spin : {std::chrono::microseconds(0), PipelineOptions{}.spin, std::chrono::microseconds(50000)}) {
    torch::manual_seed(31);
    auto net = small_convnet();
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    PipelineOptions options{4, "1f1b"};
    options.spin = spin;
    Pipeline pipe(net, {2, 3, 2}, cpus(3), options);
    losses.push_back(pipe.train_step(x, y, cross_entropy).loss);
    nets.push_back(net);
  }
  for (size_t k = 1; k < nets.size(); ++k) {
    EXPECT_TRUE(torch::equal(losses[k], losses[0])) << "spin case " << k;
    auto got = nets[k]->named_parameters(), want = nets[0]->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].value().grad(), want[i].value().grad()))
          << "spin case " << k << ": " << got[i].key();
    }
  }
}

// A failure wakes a stage that is polling for its input at once, not when
// its spin runs out: with a minute's spin the step still ends within
// seconds, with the failing stage's error.
TEST(PipelineTest, AFailureEndsAPollingWaitAtOnce) {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("fc1", nn::Linear(6, 8));
  net->push_back("fc2", nn::Linear(8, 8));
  net->push_back("fc3", nn::Linear(7, 3));  // wrong input width: fails on stage 2
  PipelineOptions options{4, "gpipe"};
  options.spin = std::chrono::seconds(60);
  Pipeline pipe(net, {1, 1, 1}, cpus(3), options);
  auto start = std::chrono::steady_clock::now();
  auto message = error_of([&] {
    pipe.train_step(torch::randn({8, 6}), torch::randint(3, {8}, torch::kInt64), cross_entropy);
  });
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("pipeline stage 2 (cpu): "), std::string::npos) << message;
  EXPECT_LT(seconds, 10.0) << "the stages polling for their input did not notice the failure";
}

// Every stage's thread computes with the process's intra-op thread count
// (at::set_num_threads), in OpenMP and MKL alike, from its first operation
// on; a fresh thread otherwise has their defaults (every core).
TEST(PipelineTest, StageThreadsComputeWithTheProcesssThreadCount) {
  namespace nn = torch::nn;
  testing::UnusualThreadCount threads;
  models::Sequence net;
  std::vector<testing::ThreadProbe> probes;
  for (int s = 0; s < 3; ++s) {
    probes.emplace_back();
    net->push_back("probe" + std::to_string(s), probes.back());
    net->push_back("fc" + std::to_string(s), nn::Linear(6, 6));
  }
  Pipeline pipe(net, {2, 2, 2}, cpus(3), {2, "1f1b"});
  pipe.train_step(torch::randn({4, 6}), torch::randint(6, {4}, torch::kInt64), cross_entropy);
  for (size_t s = 0; s < probes.size(); ++s) {
    ASSERT_EQ(probes[s]->seen().size(), 2u) << "stage " << s;
    for (const auto& seen : probes[s]->seen()) {
      EXPECT_EQ(seen.team.omp, threads.count()) << "stage " << s;
      EXPECT_EQ(seen.team.mkl, threads.count()) << "stage " << s;
    }
  }
}

// A model of `stages` pairs (a probe, then a Linear(6, 6)), its probes in
// `probes`.
models::Sequence probed(std::vector<testing::ThreadProbe>& probes, size_t stages) {
  namespace nn = torch::nn;
  models::Sequence net;
  for (size_t s = 0; s < stages; ++s) {
    probes.emplace_back();
    net->push_back("probe" + std::to_string(s), probes.back());
    net->push_back("fc" + std::to_string(s), nn::Linear(6, 6));
  }
  return net;
}

// Stage 0 runs on the caller's thread and every other stage on a thread
// kept across steps (Note [kept threads] in data_parallel.h).
TEST(PipelineTest, StageThreadsAreKept) {
  std::vector<testing::ThreadProbe> probes;
  auto net = probed(probes, 3);
  Pipeline pipe(net, {2, 2, 2}, cpus(3), {2, "1f1b"});
  for (int step = 0; step < 3; ++step) {
    pipe.train_step(torch::randn({4, 6}), torch::randint(6, {4}, torch::kInt64), cross_entropy);
  }
  std::set<int> all;
  for (size_t s = 0; s < probes.size(); ++s) {
    std::set<int> threads;
    for (const auto& seen : probes[s]->seen()) threads.insert(seen.thread);
    EXPECT_EQ(probes[s]->seen().size(), 6u) << "stage " << s;  // 3 steps x 2 micro-batches
    EXPECT_EQ(threads.size(), 1u) << "stage " << s;
    all.insert(threads.begin(), threads.end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_TRUE(all.count(testing::thread_serial()));
}

// On a GPU every stage runs on the caller's current stream of its device.
TEST(PipelineTest, StagesRunOnTheCallersStreamOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  std::vector<testing::ThreadProbe> on_gpu;
  auto gpu_net = probed(on_gpu, 2);
  gpu_net->to(gpu);
  Pipeline gpu_pipe(gpu_net, {2, 2}, {gpu, gpu}, {2, "1f1b"});
  c10::impl::VirtualGuardImpl cuda(torch::kCUDA);
  auto side = cuda.getStreamFromGlobalPool(gpu);
  ASSERT_NE(side, cuda.getDefaultStream(gpu));
  {
    c10::StreamGuard on_side(side);
    gpu_pipe.train_step(torch::randn({4, 6}, gpu), torch::randint(6, {4}, torch::kInt64).to(gpu),
                        cross_entropy);
  }
  for (size_t s = 0; s < on_gpu.size(); ++s) {
    ASSERT_EQ(on_gpu[s]->seen().size(), 2u) << "stage " << s;
    for (const auto& seen : on_gpu[s]->seen()) EXPECT_EQ(seen.stream, side) << "stage " << s;
  }
}

TEST(PipelineTest, BadOptionsAreNamed) {
  auto net = small_convnet();
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(2), {4, "zigzag"}); }).find("--schedule"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(2), {0, "gpipe"}); }).find("--micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(3), {2, "gpipe"}); }).find("2 stages but 3 devices"),
            std::string::npos);
  PipelineOptions interleaved{4, "interleaved"};
  interleaved.virtual_stages = 2;
  EXPECT_EQ(error_of([&] { Pipeline(net, {4, 3}, cpus(2), interleaved); }),
            "pipeline: 2 stages but 2 devices x --virtual-stages 2; give one device per stage");
  PipelineOptions chunked_1f1b{4, "1f1b"};
  chunked_1f1b.virtual_stages = 2;
  EXPECT_EQ(error_of([&] { Pipeline(net, {2, 2, 2, 1}, cpus(2), chunked_1f1b); }),
            "--virtual-stages 2: more than one chunk per stage needs --schedule interleaved, not 1f1b");
}

// --- across ranks: one stage per rank, send/recv over Gloo ------------------

// Each rank runs its stage of the same model; the loss (on every rank) and
// each stage's gradients equal no pipeline within 1e-5.
TEST(DistributedPipelineTest, SchedulesEqualNoPipeline) {
  const std::vector<PipelineCase> cases = {
      {{4, 3}, 4, "gpipe"}, {{4, 3}, 4, "1f1b"}, {{2, 3, 2}, 3, "1f1b"}, {{2, 3, 2}, 5, "gpipe"}};
  for (const auto& c : cases) {
    std::string what = describe_split(small_convnet(), c.sizes) + " " + c.schedule;
    torch::manual_seed(13);  // outside the rank threads: they share the generator
    auto net = small_convnet();
    auto x = torch::randn({11, 1, 8, 8});
    auto y = torch::randint(5, {11}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    const int world = static_cast<int>(c.sizes.size());
    std::vector<models::Sequence> copies;
    for (int r = 0; r < world; ++r) copies.push_back(copy_of(net));  // as if each rank built it
    std::vector<double> losses(world);
    torch::Tensor outputs;
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      auto stage = split_sequence(copies[r], c.sizes)[r];
      DistributedPipeline pipe(stage, torch::kCPU, group, {c.micro_batches, c.schedule});
      EXPECT_EQ(pipe.stage_index(), r);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == world - 1 ? y : torch::Tensor(),
                                  cross_entropy);
      losses[r] = step.loss.item<double>();
      EXPECT_EQ(step.output.defined(), r == world - 1);
      ASSERT_EQ(step.stages.size(), 1u);
      EXPECT_LE(step.stages[0].max_in_flight, c.schedule == "1f1b" ? world - r : c.micro_batches);
      torch::NoGradGuard no_grad;
      auto out = pipe.forward(r == 0 ? x : torch::Tensor());
      EXPECT_EQ(out.defined(), r == world - 1);
      if (out.defined()) outputs = out;
    }));
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::allclose(outputs, reference->forward(x), 1e-5, 1e-6)) << what;
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << what << " rank " << r;
      auto mine = split_sequence(copies[r], c.sizes)[r];
      auto theirs = split_sequence(reference, c.sizes)[r];
      expect_same_gradients(*mine, *theirs, 1e-5, what + " rank " + std::to_string(r));
    }
  }
}

// Interleaved across ranks: rank r holds pieces r, r + S, ...; the last
// rank's activations reach rank 0's next chunk (and gradients come back)
// over groups of their own, and on one rank every hand-off stays in
// memory. Loss and gradients equal no pipeline within 1e-5.
TEST(DistributedPipelineTest, InterleavedEqualsNoPipeline) {
  struct Case {
    std::vector<int64_t> sizes;
    int world;
    int64_t micro_batches;
  };
  const std::vector<Case> cases = {{{2, 2, 2, 1}, 2, 4}, {{1, 1, 2, 1, 1, 1}, 3, 5}, {{3, 2, 2}, 1, 3},
                                   {{1, 1, 2, 1, 1, 1}, 2, 2}};
  for (const auto& c : cases) {
    const int64_t chunks = static_cast<int64_t>(c.sizes.size()) / c.world;
    std::string what = describe_split(small_convnet(), c.sizes) + " over " + std::to_string(c.world) +
                       " ranks, m=" + std::to_string(c.micro_batches);
    torch::manual_seed(19);
    auto net = small_convnet();
    auto x = torch::randn({10, 1, 8, 8});
    auto y = torch::randint(5, {10}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    std::vector<models::Sequence> copies;
    for (int r = 0; r < c.world; ++r) copies.push_back(copy_of(net));
    std::vector<double> losses(c.world);
    torch::Tensor outputs;
    auto mine = [&](int r) {  // rank r's chunks of its copy
      auto pieces = split_sequence(copies[r], c.sizes);
      std::vector<models::Sequence> out;
      for (size_t k = r; k < pieces.size(); k += c.world) out.push_back(pieces[k]);
      return out;
    };
    testing::expect_no_errors(testing::run_ranks(c.world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      PipelineOptions options{c.micro_batches, "interleaved"};
      options.virtual_stages = chunks;
      DistributedPipeline pipe(mine(r), torch::kCPU, group, options);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == c.world - 1 ? y : torch::Tensor(),
                                  cross_entropy);
      losses[r] = step.loss.item<double>();
      EXPECT_EQ(step.output.defined(), r == c.world - 1);
      ASSERT_EQ(step.stages.size(), 1u);
      EXPECT_EQ(step.stages[0].actions, interleaved_schedule(c.world, c.micro_batches, chunks).actions[r]);
      // Evaluation: the whole batch through the pieces, the output on the last rank.
      torch::NoGradGuard no_grad;
      auto out = pipe.forward(r == 0 ? x : torch::Tensor());
      EXPECT_EQ(out.defined(), r == c.world - 1);
      if (out.defined()) outputs = out;
    }));
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::allclose(outputs, reference->forward(x), 1e-5, 1e-6)) << what;
    }
    auto theirs = split_sequence(reference, c.sizes);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << what << " rank " << r;
      auto chunks_of_r = mine(r);
      for (size_t j = 0; j < chunks_of_r.size(); ++j) {
        expect_same_gradients(*chunks_of_r[j], *theirs[r + j * c.world], 1e-5,
                              what + " rank " + std::to_string(r) + " chunk " + std::to_string(j));
      }
    }
  }
}

TEST(DistributedPipelineTest, ChunksMustMatchTheVirtualStages) {
  auto net = small_convnet();
  auto errors = testing::run_ranks(1, [&](std::shared_ptr<dist::ProcessGroup> group) {
    PipelineOptions options{2, "interleaved"};
    options.virtual_stages = 3;
    DistributedPipeline pipe(split_sequence(net, {4, 3}), torch::kCPU, group, options);
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "distributed pipeline: 2 chunk(s) on this rank but --virtual-stages 3");
}

// A batch of fewer rows than micro-batches (an epoch's short last batch)
// takes one micro-batch per row on every stage, as in one process: the
// loss and gradients equal no pipeline's, whether the middle stage learns
// the rows from the batch or from `rows`.
TEST(DistributedPipelineTest, FewerRowsThanMicroBatchesUseOneEach) {
  for (bool rows_given : {false, true}) {
    torch::manual_seed(17);
    auto net = small_convnet();
    auto x = torch::randn({3, 1, 8, 8});
    auto y = torch::randint(5, {3}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    const std::vector<int64_t> sizes{2, 3, 2};
    std::vector<models::Sequence> copies;
    for (int r = 0; r < 3; ++r) copies.push_back(copy_of(net));
    std::vector<double> losses(3);
    testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      DistributedPipeline pipe(split_sequence(copies[r], sizes)[r], torch::kCPU, group, {4, "1f1b"});
      // The middle stage: the whole batch, or nothing but its rows.
      auto input = r == 0 || (r == 1 && !rows_given) ? x : torch::Tensor();
      auto step = pipe.train_step(input, r == 2 ? y : torch::Tensor(), cross_entropy, {}, r == 1 && rows_given ? 3 : 0);
      EXPECT_EQ(step.micro_batches, 3);
      losses[r] = step.loss.item<double>();
    }, dist::GroupOptions{"gloo", "cpu", std::chrono::seconds(20)}));
    for (int r = 0; r < 3; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << "rank " << r;
      expect_same_gradients(*split_sequence(copies[r], sizes)[r], *split_sequence(reference, sizes)[r], 1e-5,
                            "rank " + std::to_string(r) + (rows_given ? ", rows given" : ""));
    }
  }
}

}  // namespace
}  // namespace tandem::parallel
