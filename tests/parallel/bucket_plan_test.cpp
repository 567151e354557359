// The bucket plan: exact groupings for small cases, and the invariants on a
// real model's parameters.
#include <gtest/gtest.h>

#include <set>

#include <torch/torch.h>

#include "tandem/models/registry.h"
#include "tandem/parallel/bucket_plan.h"
#include "tandem/util/check.h"

namespace tandem::parallel {
namespace {

std::vector<std::vector<size_t>> groups(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<size_t>> out;
  for (const auto& b : buckets) out.push_back(b.parameters);
  return out;
}

TEST(BucketPlanTest, ReverseOrderSmallFirstBucketThenCap) {
  // Sizes in bytes; caps: first 10, then 25.
  std::vector<ParameterInfo> p = {{4, "f"}, {8, "f"}, {20, "f"}, {3, "f"}, {6, "f"}, {5, "f"}};
  auto buckets = plan_buckets(p, {10, 25});
  // Reverse: 5 (5), 4 (6) -> 11 >= 10 closes; 3 (3), 2 (20) -> 23; 1 (8) -> 31 >= 25
  // closes; 0 (4) left open.
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{5, 4}, {3, 2, 1}, {0}}));
  EXPECT_EQ(buckets[0].bytes, 11);
  EXPECT_EQ(buckets[1].bytes, 31);
  EXPECT_EQ(buckets[2].bytes, 4);
}

TEST(BucketPlanTest, AParameterLargerThanTheCapIsAlone) {
  std::vector<ParameterInfo> p = {{1, "f"}, {100, "f"}, {1, "f"}};
  EXPECT_EQ(groups(plan_buckets(p, {10, 10})),
            (std::vector<std::vector<size_t>>{{2, 1}, {0}}));
  EXPECT_EQ(groups(plan_buckets({{100, "f"}, {1, "f"}}, {1, 1})),
            (std::vector<std::vector<size_t>>{{1}, {0}}));
}

TEST(BucketPlanTest, KindsFillSeparateBuckets) {
  std::vector<ParameterInfo> p = {{4, "half"}, {4, "float"}, {4, "half"}, {4, "float"}};
  auto buckets = plan_buckets(p, {100, 100});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{3, 1}, {2, 0}}));
  EXPECT_EQ(buckets[0].kind, "float");
  EXPECT_EQ(buckets[1].kind, "half");
}

TEST(BucketPlanTest, EmptyAndBadCaps) {
  EXPECT_TRUE(plan_buckets({}).empty());
  EXPECT_THROW(plan_buckets({{1, "f"}}, {0, 10}), Error);
}

// resnet18's 62 parameters: every one in exactly one bucket, in reverse
// registration order overall, the first bucket about 1 MiB and the others
// about 25 MiB (each over its cap by less than its last parameter).
TEST(BucketPlanTest, Resnet18) {
  models::ModelOptions o;
  auto model = models::make_model("resnet18", o);
  std::vector<ParameterInfo> p;
  for (const auto& t : model->parameters()) p.push_back({t.numel() * 4, "float32 cpu"});
  ASSERT_EQ(p.size(), 62u);
  auto buckets = plan_buckets(p);
  std::vector<size_t> order;
  for (size_t b = 0; b < buckets.size(); ++b) {
    const auto& bucket = buckets[b];
    int64_t cap = b == 0 ? (1 << 20) : (25 << 20);
    int64_t last = p[bucket.parameters.back()].bytes;
    if (b + 1 < buckets.size()) {
      EXPECT_GE(bucket.bytes, cap) << "bucket " << b;
      EXPECT_LT(bucket.bytes - last, cap) << "bucket " << b;
    } else {
      EXPECT_LT(bucket.bytes - last, cap);
    }
    order.insert(order.end(), bucket.parameters.begin(), bucket.parameters.end());
  }
  std::vector<size_t> reverse;
  for (size_t k = p.size(); k-- > 0;) reverse.push_back(k);
  EXPECT_EQ(order, reverse);
  EXPECT_GE(buckets.size(), 2u);  // 44.7 MB of parameters
}

}  // namespace
}  // namespace tandem::parallel
