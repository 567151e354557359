// The bucket plan: exact groupings for small cases, and the invariants on a
// real model's parameters.
#include <gtest/gtest.h>

#include <set>

#include <torch/torch.h>

#include "tandem/models/registry.h"
#include "tandem/parallel/bucket_plan.h"
#include "tandem/util/check.h"
#include "testing.h"

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
  EXPECT_EQ(testing::error_of([] { plan_buckets({{1, "f"}}, {10, 10, -1}); }),
            "the last bucket's cap must be >= 0 bytes, got -1");
}

// Note [small last bucket]: the first registered parameters, until they hold
// at least the last cap, are a bucket of their own, after all the others.
TEST(BucketPlanTest, TheFirstParametersMakeASmallLastBucket) {
  std::vector<ParameterInfo> p = {{4, "f"}, {8, "f"}, {20, "f"}, {3, "f"}, {6, "f"}, {5, "f"}};
  // Last cap 10: 0 (4) + 1 (8) = 12 >= 10 closes it; the rest, reversed, with
  // caps 10 then 25: 5 (5), 4 (6) -> 11 closes; 3 (3), 2 (20) left open.
  auto buckets = plan_buckets(p, {10, 25, 10});
  EXPECT_EQ(groups(buckets), (std::vector<std::vector<size_t>>{{5, 4}, {3, 2}, {1, 0}}));
  EXPECT_EQ(buckets[1].bytes, 23);
  EXPECT_EQ(buckets[2].bytes, 12);
  // Without it (0), PyTorch's plan; with a cap that every parameter fits in,
  // the same plan too, since one bucket would hold them all anyway.
  auto pytorch = groups(plan_buckets(p, {10, 25, 0}));
  EXPECT_EQ(pytorch, (std::vector<std::vector<size_t>>{{5, 4}, {3, 2, 1}, {0}}));
  EXPECT_EQ(groups(plan_buckets(p, {10, 25, 46})), pytorch);
  EXPECT_EQ(groups(plan_buckets(p, {10, 25, 1000})), pytorch);
  // A cap of 1 byte: the first parameter alone.
  EXPECT_EQ(groups(plan_buckets(p, {10, 25, 1})),
            (std::vector<std::vector<size_t>>{{5, 4}, {3, 2, 1}, {0}}));
  EXPECT_EQ(groups(plan_buckets(p, {100, 100, 1})),
            (std::vector<std::vector<size_t>>{{5, 4, 3, 2, 1}, {0}}));
  // A kind whose parameters all fit its last bucket keeps one bucket, and
  // each kind's last bucket goes after the other buckets.
  std::vector<ParameterInfo> kinds = {{4, "half"}, {4, "float"}, {4, "half"}, {4, "float"},
                                      {4, "float"}};
  EXPECT_EQ(groups(plan_buckets(kinds, {100, 100, 8})),
            (std::vector<std::vector<size_t>>{{4}, {2, 0}, {3, 1}}));
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
  auto buckets = plan_buckets(p, {int64_t(1) << 20, int64_t(25) << 20, 0});  // PyTorch's rules
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

  // With the default small last bucket: the same buckets but the last, and
  // that one split into the rest and a bucket of about 1 MiB holding the
  // first parameters (the stem and layer1), reduced last.
  auto with_last = plan_buckets(p);
  ASSERT_EQ(with_last.size(), buckets.size() + 1);
  for (size_t b = 0; b + 1 < buckets.size(); ++b) EXPECT_EQ(with_last[b].parameters, buckets[b].parameters);
  const auto& last = with_last.back();
  EXPECT_EQ(last.parameters.back(), 0u);
  EXPECT_GE(last.bytes, 1 << 20);
  EXPECT_LT(last.bytes - p[last.parameters.front()].bytes, 1 << 20);
  std::vector<size_t> tail = with_last[with_last.size() - 2].parameters;
  tail.insert(tail.end(), last.parameters.begin(), last.parameters.end());
  EXPECT_EQ(tail, buckets.back().parameters);
}

}  // namespace
}  // namespace tandem::parallel
