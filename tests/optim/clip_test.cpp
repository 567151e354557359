#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "tandem/dist/device_mesh.h"
#include "tandem/dist/placement.h"
#include "tandem/optim/clip.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::optim {
namespace clip_test {  // the file's own names (a layer's tests compile as one unit)

// Parameters of two dtypes with gradients, and one without a gradient.
std::vector<torch::Tensor> make_parameters(double gradient_scale) {
  torch::manual_seed(3);
  std::vector<torch::Tensor> params = {torch::randn({5, 3}), torch::randn({3}),
                                       torch::randn({4, 2}, torch::kFloat64), torch::randn({2, 2})};
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].requires_grad_();
    if (i != 3) params[i].mutable_grad() = torch::randn_like(params[i]) * gradient_scale;
  }
  return params;
}

// The global norm in float64, as the sum of every gradient's squares.
double reference_norm(const std::vector<torch::Tensor>& params) {
  double squares = 0;
  for (const auto& p : params) {
    if (p.grad().defined()) squares += p.grad().to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return std::sqrt(squares);
}

TEST(ClipGradNormTest, ScalesEveryGradientByMaxNormOverTheGlobalNorm) {
  auto params = make_parameters(/*gradient_scale=*/3.0);
  std::vector<torch::Tensor> before;
  for (const auto& p : params) before.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  const double norm = reference_norm(params);
  ASSERT_GT(norm, 1.0);

  auto returned = clip_grad_norm(params, /*max_norm=*/1.0);
  EXPECT_NEAR(returned.item<double>(), norm, 1e-5 * norm);
  const double coefficient = 1.0 / (norm + 1e-6);
  for (size_t i = 0; i < params.size(); ++i) {
    if (!before[i].defined()) {
      EXPECT_FALSE(params[i].grad().defined()) << "a parameter without a gradient got one";
      continue;
    }
    EXPECT_TRUE(torch::allclose(params[i].grad(), before[i] * coefficient, 1e-6, 1e-9)) << i;
    EXPECT_EQ(params[i].grad().scalar_type(), before[i].scalar_type());
  }
  EXPECT_NEAR(reference_norm(params), 1.0, 1e-5);  // what clipping is for
}

// One gradient on cuda:0: the result of all on the CPU, the norm on the
// first gradient's device (the CPU here).
TEST(ClipGradNormTest, GradientsOnTwoDevicesClipAsOnOne) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  auto params = make_parameters(/*gradient_scale=*/3.0);
  auto mixed = make_parameters(3.0);
  mixed[1] = mixed[1].detach().to(torch::kCUDA).requires_grad_();
  mixed[1].mutable_grad() = params[1].grad().to(torch::kCUDA);
  const double norm = reference_norm(params);
  auto returned = clip_grad_norm(params, 1.0);
  auto mixed_norm = clip_grad_norm(mixed, 1.0);
  EXPECT_TRUE(mixed_norm.device().is_cpu());
  EXPECT_NEAR(mixed_norm.item<double>(), returned.item<double>(), 1e-5 * norm);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].grad().defined()) {
      EXPECT_TRUE(torch::allclose(mixed[i].grad().cpu(), params[i].grad(), 1e-6, 1e-9)) << i;
    }
  }
}

TEST(ClipGradNormTest, AgreesWithLibtorchsOwnOnOneDevice) {
  torch::manual_seed(5);
  std::vector<torch::Tensor> ours = {torch::randn({64, 32}), torch::randn({32}), torch::randn({10, 64})};
  std::vector<torch::Tensor> theirs;
  for (auto& p : ours) {
    p.requires_grad_();
    p.mutable_grad() = torch::randn_like(p);
    auto q = p.detach().clone().requires_grad_();
    q.mutable_grad() = p.grad().clone();
    theirs.push_back(q);
  }
  double their_norm = torch::nn::utils::clip_grad_norm_(theirs, 2.5);
  auto our_norm = clip_grad_norm(ours, 2.5);
  EXPECT_NEAR(our_norm.item<double>(), their_norm, 1e-5 * their_norm);
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_TRUE(torch::allclose(ours[i].grad(), theirs[i].grad(), 1e-6, 1e-9)) << i;
  }
}

TEST(ClipGradNormTest, GradientsUnderTheLimitAreLeftExactlyAsTheyWere) {
  auto params = make_parameters(/*gradient_scale=*/1e-3);
  std::vector<torch::Tensor> before;
  for (const auto& p : params) before.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
  auto returned = clip_grad_norm(params, /*max_norm=*/10.0);
  EXPECT_NEAR(returned.item<double>(), reference_norm(params), 1e-9);
  for (size_t i = 0; i < params.size(); ++i) {
    if (before[i].defined()) EXPECT_TRUE(torch::equal(params[i].grad(), before[i])) << i;
  }
}

TEST(ClipGradNormTest, NoGradientsGiveZeroAndABadLimitIsNamed) {
  std::vector<torch::Tensor> none = {torch::randn({3}).requires_grad_()};
  EXPECT_EQ(clip_grad_norm(none, 1.0).item<double>(), 0.0);
  EXPECT_FALSE(none[0].grad().defined());

  auto params = make_parameters(1.0);
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    auto message = testing::error_of([&] { clip_grad_norm(params, bad); });
    EXPECT_NE(message.find("expected a positive finite max_norm"), std::string::npos) << message;
  }
}

// Over ranks that each hold part of the gradients (FSDP's shards, a
// pipeline's stages), the norm is the whole gradient's on every rank; a
// rank with no gradient at all (a stage of parameter-free layers) still
// joins the collective and returns that norm.
// In float64 too: a rank without gradients joins with the others' size.
TEST(ClipGradNormTest, OverRanksTheNormIsTheWholeGradientsAndARankWithoutOneJoins) {
  for (auto dtype : {torch::kFloat32, torch::kFloat64})
  for (bool second_has_gradient : {true, false}) {
    std::vector<double> norms(2), kept(2);
    testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
      const auto r = group->rank();
      auto p = torch::zeros({2}, dtype).requires_grad_();
      if (r == 0) p.mutable_grad() = torch::tensor({3.0, 0.0}, dtype);
      if (r == 1 && second_has_gradient) p.mutable_grad() = torch::tensor({0.0, 4.0}, dtype);
      norms[r] = clip_grad_norm({p}, 1.0, group.get()).item<double>();
      kept[r] = p.grad().defined() ? p.grad().norm().item<double>() : -1.0;
    }));
    const double whole = second_has_gradient ? 5.0 : 3.0;
    for (int r = 0; r < 2; ++r) EXPECT_NEAR(norms[r], whole, 1e-6) << "rank " << r;
    EXPECT_NEAR(kept[0], 3.0 / whole, 1e-6);  // every part scaled by 1 / the whole norm
    EXPECT_NEAR(kept[1], second_has_gradient ? 4.0 / whole : -1.0, 1e-6);
  }
}

// On a dp=2 x tp=2 mesh of thread ranks, each rank clips the pieces it
// holds, counted by their placements (Note [placements]): A cut over tp
// by chosen rows and replicated over dp (DDP x tp), B replicated on both,
// C a run of the elements of a tensor a rank holds (Shard over dp,
// replicated over tp; PlacedTensor's run, as FSDP's shards are given), D
// held by ranks 0 and 3 as a tied weight and its copy (an HSDP-like mix:
// the dp ranks hold some pieces disjoint, others replicated). Every rank gets
// the whole gradient's norm in float64 and scales its pieces by the same
// factor. The control counts every piece on every rank, as a plan that
// knew no placements would, and misses the bound.
TEST(ClipGradNormTest, OnAMeshEachPieceIsCountedOnceByItsPlacement) {
  torch::manual_seed(5);
  const auto a = torch::randn({6, 3}, torch::kFloat64), b = torch::randn({5}, torch::kFloat64);
  const auto c = torch::randn({8}, torch::kFloat64), d = torch::randn({4}, torch::kFloat64);
  const double whole = std::sqrt((a.pow(2).sum() + b.pow(2).sum() + c.pow(2).sum() + d.pow(2).sum()).item<double>());
  const double max_norm = whole / 4;
  std::vector<torch::Tensor> cut_rows = {torch::tensor({0, 2, 4}, torch::kLong), torch::tensor({1, 3, 5}, torch::kLong)};
  std::vector<double> norms(4), controls(4), scaled(4);
  testing::expect_no_errors(testing::run_ranks(4, [&](std::shared_ptr<dist::ProcessGroup> world) {
    dist::DeviceMesh mesh(world, dist::parse_mesh("dp=2,tp=2", 4));
    const dist::PlacementMesh placed_on{world, nullptr, mesh.group(dist::MeshDim::kData),
                                        mesh.group(dist::MeshDim::kTensor), nullptr, /*data_sharded=*/true};
    EXPECT_EQ(placed_on.sum_group(), world.get());
    auto held = [&](bool counted_everywhere) {
      auto tensor_of = [](const torch::Tensor& grad) {
        auto p = torch::zeros_like(grad).requires_grad_();
        p.mutable_grad() = grad.clone();
        return p;
      };
      std::vector<dist::PlacedTensor> pieces;
      auto cut = dist::Placement::shard(0, 6, cut_rows);
      auto pa = tensor_of(dist::part_of_whole(a, cut, *mesh.group(dist::MeshDim::kTensor)));
      pieces.push_back({"a", pa, pa});
      pieces.back().tensor_parallel = cut;
      auto pb = tensor_of(b);
      pieces.push_back({"b", pb, pb});
      // C's holder: 2 elements of padding before this rank's run of 4.
      const int64_t dp = mesh.coordinate(dist::MeshDim::kData);
      auto flat = tensor_of(torch::cat({torch::full({2}, 1e3, torch::kFloat64), c.narrow(0, 4 * dp, 4)}));
      dist::PlacedTensor pc{"c", flat, flat};
      pc.flat_offset = 2;
      pc.flat_numel = 4;
      pc.data_parallel = dist::Placement::shard(0, 8);
      pieces.push_back(pc);
      if (world->rank() == 0 || world->rank() == 3) {
        auto pd = tensor_of(d);
        pieces.push_back({"d", pd, pd});
        pieces.back().owned = world->rank() == 0;
      }
      if (counted_everywhere) {
        for (auto& t : pieces) t.owned = true, t.data_parallel = t.tensor_parallel = dist::Placement::shard(0, 1);
      }
      return pieces;
    };
    const auto r = world->rank();
    auto pieces = held(false);
    auto grads = dist::counted_gradients(pieces, placed_on);
    norms[r] = clip_gradients(grads.counted, max_norm, world.get(), grads.others).item<double>();
    scaled[r] = (pieces[1].grad().norm() / b.norm()).item<double>();
    EXPECT_EQ(pieces[2].tensor.grad()[0].item<double>(), 1e3) << "the padding is not clipped";
    auto control = held(true);
    auto all = dist::counted_gradients(control, placed_on);
    controls[r] = clip_gradients(all.counted, max_norm, world.get(), all.others).item<double>();
  }));
  for (int r = 0; r < 4; ++r) {
    EXPECT_NEAR(norms[r], whole, 1e-12 * whole) << "rank " << r;
    EXPECT_NEAR(scaled[r], max_norm / (whole + 1e-6), 1e-12) << "rank " << r;
    EXPECT_GT(std::abs(controls[r] - whole), 1e-3 * whole) << "the control must miss the bound";
  }
}

TEST(ClipGradNormTest, ANonFiniteNormIsReturnedNotThrown) {
  // PyTorch's default (error_if_nonfinite=False): the caller, or the fp16
  // scaler that already saw the inf, decides.
  auto params = make_parameters(1.0);
  params[1].mutable_grad()[0] = std::numeric_limits<float>::infinity();
  auto returned = clip_grad_norm(params, 1.0);
  EXPECT_TRUE(std::isinf(returned.item<double>()));
}

}  // namespace clip_test
}  // namespace tandem::optim
