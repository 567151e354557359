#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/data/sampler.h"
#include "tandem/util/check.h"
#include "testing.h"

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

namespace tandem::data {
namespace {

// Index lists of torch.utils.data.DistributedSampler for a table of cases,
// computed by the pinned torch in Python at test time.
TEST(DistributedSamplerTest, EqualsPyTorchDistributedSampler) {
  const char* script =
      "import json, sys, torch\n"
      "from torch.utils.data import DistributedSampler\n"
      "out = []\n"
      "for n in (0, 1, 5, 10, 13, 64):\n"
      "  for w in (1, 2, 3, 4, 7):\n"
      "    for shuffle in (False, True):\n"
      "      for drop_last in (False, True):\n"
      "        for seed, epoch in ((0, 0), (7, 3)):\n"
      "          if n == 0 and not drop_last: continue\n"
      "          for r in range(w):\n"
      "            s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=shuffle,\n"
      "                                   seed=seed, drop_last=drop_last)\n"
      "            s.set_epoch(epoch)\n"
      "            out.append([n, w, r, int(shuffle), int(drop_last), seed, epoch, list(s)])\n"
      "print(json.dumps(out))\n";
  std::string path = ::testing::TempDir() + "/distributed_sampler_reference.py";
  std::ofstream(path) << script;
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " + path);
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto cases = nlohmann::json::parse(result.output);
  ASSERT_GT(cases.size(), 500u);
  for (const auto& c : cases) {
    DistributedSamplerOptions o;
    int64_t n = c[0];
    o.world_size = c[1];
    o.rank = c[2];
    o.shuffle = c[3].get<int>() != 0;
    o.drop_last = c[4].get<int>() != 0;
    o.seed = c[5];
    DistributedSampler sampler(n, o);
    auto expected = c[7].get<std::vector<int64_t>>();
    ASSERT_EQ(sampler.indices(c[6]), expected) << c.dump();
    ASSERT_EQ(sampler.size(), static_cast<int64_t>(expected.size())) << c.dump();
  }
}

// The union of the ranks' k-th batches of B is the single-process k-th batch
// of W * B, for every k.
TEST(DistributedSamplerTest, RankBatchesUnionToTheGlobalBatch) {
  const int64_t n = 96, w = 4, b = 6;
  RandomSampler single(n, 11);
  auto global = single.indices(2);
  for (int64_t k = 0; k < n / (w * b); ++k) {
    std::vector<int64_t> together;
    for (int64_t r = 0; r < w; ++r) {
      auto mine = DistributedSampler(n, {w, r, true, 11, false}).indices(2);
      together.insert(together.end(), mine.begin() + k * b, mine.begin() + (k + 1) * b);
    }
    std::vector<int64_t> expected(global.begin() + k * w * b, global.begin() + (k + 1) * w * b);
    std::sort(together.begin(), together.end());
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(together, expected) << "batch " << k;
  }
}

TEST(DistributedSamplerTest, BadRankOrWorldIsAnError) {
  EXPECT_THROW(DistributedSampler(10, {2, 2}), Error);
  EXPECT_THROW(DistributedSampler(10, {0, 0}), Error);
  EXPECT_THROW(DistributedSampler(10, {2, -1}), Error);
}

TEST(PartitionTest, DisjointPartsOfTheRequestedSizes) {
  auto parts = partition_indices(1000, {0.7, 0.2, 0.1}, 1234);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].size(), 700u);
  EXPECT_EQ(parts[1].size(), 200u);
  EXPECT_EQ(parts[2].size(), 100u);
  std::vector<int64_t> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, SequentialSampler(1000).indices(0));
  EXPECT_EQ(partition_indices(1000, {0.7, 0.2, 0.1}, 1234), parts);  // same seed, same parts
  EXPECT_NE(partition_indices(1000, {0.7, 0.2, 0.1}, 99)[0], parts[0]);
  // Seed 004 splits evenly over ranks: 1/W each, int(n / W) indices.
  auto even = partition_indices(10, {1.0 / 3, 1.0 / 3, 1.0 / 3}, 0);
  EXPECT_EQ(even[0].size(), 3u);
  EXPECT_THROW(partition_indices(10, {0.8, 0.3}, 0), Error);
  EXPECT_THROW(partition_indices(10, {-0.1}, 0), Error);
}

}  // namespace
}  // namespace tandem::data
