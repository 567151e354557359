// Stage splits: balanced by cost (against brute force), by layer names,
// interleaved, and the costs measured as training would see them.
#include "pipeline_fixture.h"

namespace tandem::parallel {
namespace {

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

}  // namespace
}  // namespace tandem::parallel
