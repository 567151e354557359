#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/util/check.h"

namespace tandem::data {
namespace {

// Sample i is the 2x3x3 image filled with i; asking for `poison` fails.
class FilledDataset : public Dataset {
 public:
  FilledDataset(int64_t n, int64_t poison) : n_(n), poison_(poison) {}
  int64_t size() const override { return n_; }
  DatasetInfo info() const override { return {2, 3, 3, 10}; }
  Batch get_batch(const std::vector<int64_t>& indices, int64_t) const override {
    for (auto i : indices) TANDEM_CHECK(i != poison_, "sample ", i, " is poisoned");
    auto index = torch::tensor(indices, torch::kInt64);
    auto inputs = index.to(torch::kFloat32).view({-1, 1, 1, 1}).expand({-1, 2, 3, 3}).contiguous();
    return {inputs, index % 10};
  }
  std::string describe() const override { return "filled"; }

 private:
  int64_t n_, poison_;
};

DataLoader make_loader(int64_t n, int64_t poison, bool pin) {
  LoaderOptions options;
  options.batch_size = 4;
  options.workers = 2;
  options.pin_memory = pin;
  return DataLoader(std::make_shared<FilledDataset>(n, poison), std::make_shared<SequentialSampler>(n), options);
}

// Every batch arrives, in order, on the device, in the dtype and memory
// format asked for, equal to the host batch; then the end.
void check_hands_out_converted_batches(torch::Device device) {
  auto loader = make_loader(10, -1, device.is_cuda());
  DevicePrefetcher batches(loader.epoch(0), {device, torch::kFloat64, /*channels_last=*/true});
  std::vector<int64_t> seen;
  while (auto batch = batches.next()) {
    EXPECT_EQ(batch->inputs.device(), device);
    EXPECT_EQ(batch->targets.device(), device);
    EXPECT_EQ(batch->inputs.scalar_type(), torch::kFloat64);
    EXPECT_TRUE(batch->inputs.is_contiguous(torch::MemoryFormat::ChannelsLast));
    auto inputs = batch->inputs.cpu();
    auto targets = batch->targets.cpu();
    for (int64_t i = 0; i < batch->size(); ++i) {
      auto index = static_cast<int64_t>(seen.size());
      EXPECT_TRUE(torch::equal(inputs[i], torch::full({2, 3, 3}, static_cast<double>(index), torch::kFloat64)))
          << device << " sample " << index;
      EXPECT_EQ(targets[i].item<int64_t>(), index % 10);
      seen.push_back(index);
    }
  }
  EXPECT_EQ(seen.size(), 10u) << device;
  EXPECT_FALSE(batches.next().has_value());
}

TEST(DevicePrefetcherTest, HandsOutTheLoadersBatchesConvertedOnTheDevice) {
  check_hands_out_converted_batches(torch::kCPU);
}

// From pinned memory, through the copy stream (Note [prefetch stream]).
TEST(DevicePrefetcherTest, HandsOutTheLoadersBatchesConvertedOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_hands_out_converted_batches(torch::Device(torch::kCUDA, 0));
}

// A loader error surfaces at the batch it belongs to, after the batches
// before it, although the prefetcher asked for it one step early.
void check_a_loader_error_comes_with_its_own_batch(torch::Device device) {
  auto loader = make_loader(16, /*poison=*/9, device.is_cuda());  // in the third batch
  DevicePrefetcher batches(loader.epoch(0), {device});
  ASSERT_TRUE(batches.next().has_value());
  ASSERT_TRUE(batches.next().has_value());
  try {
    batches.next();
    FAIL() << device << ": no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 9 is poisoned"), std::string::npos) << e.what();
  }
}

TEST(DevicePrefetcherTest, ALoaderErrorComesWithItsOwnBatch) {
  check_a_loader_error_comes_with_its_own_batch(torch::kCPU);
}

// Likewise through the copy stream (Note [prefetch stream]).
TEST(DevicePrefetcherTest, ALoaderErrorComesWithItsOwnBatchOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_a_loader_error_comes_with_its_own_batch(torch::Device(torch::kCUDA, 0));
}

}  // namespace
}  // namespace tandem::data
