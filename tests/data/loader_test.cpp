#include <gtest/gtest.h>

#include <atomic>
#include <limits>

#include "tandem/data/loader.h"
#include "tandem/util/check.h"

namespace tandem::data {
namespace {

// Sample i is the constant image i; fails on request for `poison`.
class CountingDataset : public Dataset {
 public:
  explicit CountingDataset(int64_t n, int64_t poison = -1) : n_(n), poison_(poison) {}
  int64_t size() const override { return n_; }
  DatasetInfo info() const override { return {1, 2, 2, 10}; }
  Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch) const override {
    calls_++;
    for (auto i : indices) TANDEM_CHECK(i != poison_, "sample ", i, " is poisoned");
    auto index = torch::tensor(indices, torch::kInt64);
    auto inputs = index.to(torch::kFloat32).view({-1, 1, 1, 1}).expand({-1, 1, 2, 2}) + epoch * 1000;
    return {inputs.contiguous(), index % 10};
  }
  std::string describe() const override { return "counting"; }
  mutable std::atomic<int> calls_{0};

 private:
  int64_t n_, poison_;
};

std::vector<std::vector<int64_t>> collect(const DataLoader& loader, int64_t epoch, int64_t skip = 0) {
  std::vector<std::vector<int64_t>> out;
  auto it = loader.epoch(epoch, skip);
  while (auto batch = it->next()) {
    auto values = batch->inputs.select(2, 0).select(2, 0).select(1, 0).to(torch::kInt64) - epoch * 1000;
    out.emplace_back(values.data_ptr<int64_t>(), values.data_ptr<int64_t>() + values.numel());
  }
  return out;
}

TEST(LoaderTest, CoversEveryIndexOnceInSamplerOrder) {
  auto dataset = std::make_shared<CountingDataset>(10);
  auto sampler = std::make_shared<RandomSampler>(10, 3);
  DataLoader loader(dataset, sampler, {/*batch_size=*/4});
  EXPECT_EQ(loader.num_batches(), 3);
  auto batches = collect(loader, 1);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].size(), 2u);
  std::vector<int64_t> flat;
  for (auto& b : batches) flat.insert(flat.end(), b.begin(), b.end());
  EXPECT_EQ(flat, sampler->indices(1));
}

TEST(LoaderTest, DropLastDropsTheShortBatch) {
  auto dataset = std::make_shared<CountingDataset>(10);
  DataLoader loader(dataset, std::make_shared<SequentialSampler>(10), {4, /*drop_last=*/true});
  EXPECT_EQ(loader.num_batches(), 2);
  EXPECT_EQ(collect(loader, 0), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

// A batch size of any size up to INT64_MAX is one batch of everything
// ((n + b - 1) / b wrapped round to 0 batches: tandem eval scored 0 images).
TEST(LoaderTest, AHugeBatchSizeIsOneBatchOfEverything) {
  auto dataset = std::make_shared<CountingDataset>(10);
  for (int64_t batch : {int64_t{11}, std::numeric_limits<int64_t>::max() - 5, std::numeric_limits<int64_t>::max()}) {
    DataLoader loader(dataset, std::make_shared<SequentialSampler>(10), {batch});
    EXPECT_EQ(loader.num_batches(), 1) << batch;
    EXPECT_EQ(collect(loader, 0), (std::vector<std::vector<int64_t>>{{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}})) << batch;
  }
}
TEST(LoaderTest, SkipResumesMidEpoch) {
  auto dataset = std::make_shared<CountingDataset>(10);
  DataLoader loader(dataset, std::make_shared<SequentialSampler>(10), {3});
  EXPECT_EQ(collect(loader, 0, /*skip=*/2), (std::vector<std::vector<int64_t>>{{6, 7, 8}, {9}}));
}

TEST(LoaderTest, WorkersGiveTheSameBatchesInTheSameOrder) {
  auto dataset = std::make_shared<CountingDataset>(1000);
  auto sampler = std::make_shared<RandomSampler>(1000, 9);
  DataLoader inline_loader(dataset, sampler, {7});
  auto expected = collect(inline_loader, 4);
  for (int64_t workers : {1, 3, 8}) {
    DataLoader threaded(dataset, sampler, {7, false, workers});
    EXPECT_EQ(collect(threaded, 4), expected) << workers << " workers";
  }
}

// Batch 5 fails: batches 0 to 4 come out first, however the 4 workers race
// (repeated to give the races a chance), then its error.
TEST(LoaderTest, AWorkerErrorComesInPlaceOfItsBatch) {
  auto dataset = std::make_shared<CountingDataset>(100, /*poison=*/57);
  DataLoader loader(dataset, std::make_shared<SequentialSampler>(100), {10, false, 4});
  for (int round = 0; round < 20; ++round) {
    auto it = loader.epoch(0);
    int good = 0;
    try {
      while (it->next()) ++good;
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "sample 57 is poisoned");
    }
    EXPECT_EQ(good, 5) << "round " << round;
  }
}

TEST(LoaderTest, AbandonedEpochStopsItsWorkersAndPrefetchIsBounded) {
  auto dataset = std::make_shared<CountingDataset>(10000);
  DataLoader loader(dataset, std::make_shared<SequentialSampler>(10000),
                    {10, false, /*workers=*/2, /*prefetch_factor=*/2});
  {
    auto it = loader.epoch(0);
    ASSERT_TRUE(it->next());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    // One handed out plus at most workers * prefetch_factor ahead.
    EXPECT_LE(dataset->calls_.load(), 1 + 4);
  }  // destroyed with 990 batches left: must join, not hang
  EXPECT_LE(dataset->calls_.load(), 1 + 4);
}

}  // namespace
}  // namespace tandem::data
