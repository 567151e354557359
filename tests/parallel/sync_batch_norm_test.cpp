// SyncBatchNorm on W ranks with B samples each equals BatchNorm2d on the
// whole W * B batch: outputs, input gradients, summed parameter gradients
// and running statistics. Ranks are threads over Gloo on 127.0.0.1.
#include <gtest/gtest.h>

#include <thread>

#include <torch/torch.h>

#include "tandem/parallel/sync_batch_norm.h"
#include "testing.h"
#include "tandem/util/check.h"

namespace tandem::parallel {
namespace {

struct Reference {
  torch::Tensor input, output, input_grad, weight_grad, bias_grad, running_mean, running_var;
  torch::Tensor weight, bias, upstream;
};

Reference reference(int64_t batch) {
  torch::manual_seed(5);
  Reference r;
  r.input = torch::randn({batch, 3, 5, 4}) * 2 + 1;
  r.upstream = torch::randn({batch, 3, 5, 4});
  r.weight = torch::rand({3}) + 0.5;
  r.bias = torch::randn({3});
  torch::nn::BatchNorm2d bn(3);
  {
    torch::NoGradGuard no_grad;
    bn->weight.copy_(r.weight);
    bn->bias.copy_(r.bias);
  }
  auto x = r.input.clone().requires_grad_(true);
  r.output = bn->forward(x);
  (r.output * r.upstream).sum().backward();
  r.input_grad = x.grad();
  r.weight_grad = bn->weight.grad();
  r.bias_grad = bn->bias.grad();
  r.running_mean = bn->running_mean.clone();
  r.running_var = bn->running_var.clone();
  return r;
}

void expect_close(const torch::Tensor& a, const torch::Tensor& b, const char* what, int rank) {
  EXPECT_TRUE(torch::allclose(a, b, /*rtol=*/1e-4, /*atol=*/1e-5))
      << what << " on rank " << rank << ", max difference " << (a - b).abs().max().item<double>();
}

void run_case(int world) {
  const int64_t per_rank = 3;
  auto ref = reference(per_rank * world);
  auto errors = testing::run_ranks(
      world,
      [&](std::shared_ptr<dist::ProcessGroup> group) {
        const int64_t rank = group ? group->rank() : 0;
        SyncBatchNorm bn(SyncBatchNormOptions{3}, group);
        {
          torch::NoGradGuard no_grad;
          bn->weight.copy_(ref.weight);
          bn->bias.copy_(ref.bias);
        }
        auto shard = [&](const torch::Tensor& t) { return t.slice(0, rank * per_rank, (rank + 1) * per_rank); };
        auto x = shard(ref.input).clone().requires_grad_(true);
        auto y = bn->forward(x);
        (y * shard(ref.upstream)).sum().backward();
        expect_close(y, shard(ref.output), "output", rank);
        expect_close(x.grad(), shard(ref.input_grad), "input gradient", rank);
        auto wg = bn->weight.grad().clone(), bg = bn->bias.grad().clone();
        if (group) {
          group->all_reduce(wg).wait();
          group->all_reduce(bg).wait();
        }
        expect_close(wg, ref.weight_grad, "weight gradient (summed)", rank);
        expect_close(bg, ref.bias_grad, "bias gradient (summed)", rank);
        expect_close(bn->running_mean, ref.running_mean, "running mean", rank);
        expect_close(bn->running_var, ref.running_var, "running var", rank);
        EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 1);
        bn->eval();
        expect_close(bn->forward(shard(ref.input)),
                     torch::batch_norm(shard(ref.input), ref.weight, ref.bias, ref.running_mean,
                                       ref.running_var, false, 0.1, 1e-5, false),
                     "eval output", rank);
      },
      {}, 0, /*null_group_for_one=*/true);
  testing::expect_no_errors(errors);
}

TEST(SyncBatchNormTest, OneProcessEqualsBatchNorm) { run_case(1); }
TEST(SyncBatchNormTest, TwoRanksEqualBatchNormOnTheWholeBatch) { run_case(2); }
TEST(SyncBatchNormTest, FourRanksEqualBatchNormOnTheWholeBatch) { run_case(4); }

TEST(SyncBatchNormTest, ParameterNamesAreBatchNormsAndBadInputIsNamed) {
  SyncBatchNorm bn(SyncBatchNormOptions{4}, nullptr);
  std::vector<std::string> names;
  for (const auto& p : bn->named_parameters()) names.push_back(p.key());
  for (const auto& b : bn->named_buffers()) names.push_back(b.key());
  EXPECT_EQ(names, (std::vector<std::string>{"weight", "bias", "running_mean", "running_var",
                                             "num_batches_tracked"}));
  EXPECT_THROW(bn->forward(torch::randn({2, 3, 4, 4})), Error);
}

}  // namespace
}  // namespace tandem::parallel
