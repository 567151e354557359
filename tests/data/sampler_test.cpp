#include <gtest/gtest.h>

#include "tandem/data/sampler.h"

namespace tandem::data {

// torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)),
// computed with the pinned torch 2.11 wheel: PyTorch's DistributedSampler order.
TEST(SamplerTest, RandomSamplerMatchesPyTorchRandperm) {
  RandomSampler sampler(/*n=*/12, /*seed=*/7);
  EXPECT_EQ(sampler.indices(/*epoch=*/3),
            (std::vector<int64_t>{5, 2, 4, 7, 1, 9, 11, 0, 3, 8, 10, 6}));
  EXPECT_EQ(RandomSampler(10, 0).indices(0), (std::vector<int64_t>{4, 1, 7, 5, 3, 9, 0, 8, 6, 2}));
}

TEST(SamplerTest, SameEpochSameOrderOtherEpochOtherOrder) {
  RandomSampler sampler(1000, 42);
  EXPECT_EQ(sampler.indices(5), sampler.indices(5));
  EXPECT_NE(sampler.indices(5), sampler.indices(6));
  auto sorted = sampler.indices(2);
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, SequentialSampler(1000).indices(0));
}

}  // namespace tandem::data
