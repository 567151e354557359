// Placements (Note [placements]): the rows a Shard gives each rank, and a
// tensor cut by its placement and made whole again over thread ranks,
// exactly, for even and chosen rows, Partial sums and Replicate copies.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/dist/device_mesh.h"
#include "tandem/dist/placement.h"
#include "testing.h"

namespace tandem::dist {
namespace {

std::vector<int64_t> rows(const Placement& p, int64_t rank, int64_t ranks) {
  auto r = p.rows_of(rank, ranks);
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

// Shard's even pieces are torch.chunk's: ceil(whole / ranks) rows each,
// the last ones shorter or empty, every row held once.
TEST(PlacementTest, EvenShardsAreTorchChunksPieces) {
  const auto ten = Placement::shard(0, 10);
  EXPECT_EQ(rows(ten, 0, 4), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(rows(ten, 2, 4), (std::vector<int64_t>{6, 7, 8}));
  EXPECT_EQ(rows(ten, 3, 4), (std::vector<int64_t>{9}));
  const auto two = Placement::shard(1, 2);
  EXPECT_EQ(rows(two, 1, 4), (std::vector<int64_t>{1}));
  EXPECT_TRUE(rows(two, 3, 4).empty());
  for (int64_t whole : {0, 1, 5, 7, 12}) {
    for (int64_t ranks : {1, 2, 3, 5}) {
      std::vector<int64_t> all;
      for (int64_t r = 0; r < ranks; ++r) {
        auto mine = rows(Placement::shard(0, whole), r, ranks);
        all.insert(all.end(), mine.begin(), mine.end());
      }
      auto expected = torch::arange(whole, torch::kLong);
      EXPECT_EQ(all, (std::vector<int64_t>(expected.data_ptr<int64_t>(), expected.data_ptr<int64_t>() + whole)))
          << whole << " rows over " << ranks;
    }
  }
  EXPECT_EQ(ten.str(), "Shard(0)");
  EXPECT_EQ(Placement::replicate().str(), "Replicate()");
  EXPECT_EQ(Placement::partial().str(), "Partial(sum)");
}

TEST(PlacementTest, ChosenRowsMustCoverTheWholeAndAPartialIsNotCounted) {
  EXPECT_NE(testing::error_of([] { Placement::shard(0, 5, {torch::arange(2, torch::kLong)}); })
                .find("the ranks' rows number 2, not the whole's 5"),
            std::string::npos);
  PlacedTensor pending{"h.0.mlp.c_fc.bias", torch::zeros({4}), torch::zeros({4})};
  pending.tensor_parallel = Placement::partial();
  EXPECT_NE(testing::error_of([&] { counted_here(pending, {}); })
                .find("h.0.mlp.c_fc.bias is a pending sum (Partial) where a whole value was expected"),
            std::string::npos);
}

// Over three thread ranks: each placement's part of a float64 tensor is
// made whole again bit for bit, among them rows chosen as tensor
// parallelism chooses them for a fused q, k, v projection (each rank a
// run of q's rows, of k's and of v's) and a Partial whose parts sum to it.
TEST(PlacementTest, EveryPlacementsPartIsMadeWholeExactly) {
  const auto whole = torch::randn({9, 5}, torch::kFloat64);
  std::vector<torch::Tensor> qkv;
  for (int64_t r = 0; r < 3; ++r) qkv.push_back(torch::tensor({r, 3 + r, 6 + r}, torch::kLong));
  const std::vector<Placement> placements = {Placement::shard(0, 9), Placement::shard(1, 5),
                                             Placement::shard(0, 9, qkv), Placement::replicate(),
                                             Placement::partial()};
  testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<ProcessGroup> group) {
    for (const auto& p : placements) {
      auto part = part_of_whole(whole, p, *group);
      if (p.is_partial()) part = whole * (group->rank() + 1) / 6.0;  // 1/6 + 2/6 + 3/6
      if (p.is_shard()) {
        EXPECT_EQ(part.size(p.dim), p.rows_of(group->rank(), 3).numel()) << p.str();
      }
      auto made = whole_of_part(part, p, *group);
      if (p.is_partial()) {
        EXPECT_TRUE(torch::allclose(made, whole, 1e-15, 0)) << p.str();
      } else {
        EXPECT_TRUE(torch::equal(made, whole)) << p.str();
      }
    }
  }));
}

// A sum over pieces (a gradient norm) runs over the dimensions whose ranks
// hold disjoint pieces: a pipeline's stages, tp's parts, and the dp ranks
// only when they hold shards; none when every rank holds the whole.
TEST(PlacementTest, ASumRunsOverTheDimensionsWhoseRanksHoldDisjointPieces) {
  testing::expect_no_errors(testing::run_ranks(4, [&](std::shared_ptr<ProcessGroup> world) {
    std::vector<std::unique_ptr<DeviceMesh>> meshes;  // alive until every rank has made them all
    for (const std::string spec : {"dp=4", "pp=2,dp=2", "dp=2,tp=2", "pp=2,tp=2"}) {
      const auto& mesh = *meshes.emplace_back(std::make_unique<DeviceMesh>(world, parse_mesh(spec, 4)));
      auto group = [&](MeshDim d) { return mesh.shape()[d] > 1 ? mesh.group(d) : nullptr; };
      PlacementMesh on{world, group(MeshDim::kPipeline), group(MeshDim::kData), group(MeshDim::kTensor),
                       mesh.model_group()};
      ProcessGroup* copies = spec == "dp=4"        ? nullptr
                             : spec == "pp=2,dp=2" ? mesh.group(MeshDim::kPipeline).get()
                             : spec == "dp=2,tp=2" ? mesh.group(MeshDim::kTensor).get()
                                                   : mesh.model_group().get();
      EXPECT_EQ(on.sum_group(), copies) << spec << " with the dp ranks' copies";
      on.data_sharded = true;
      ProcessGroup* shards = spec == "dp=4" ? mesh.group(MeshDim::kData).get()
                             : spec == "pp=2,tp=2" ? mesh.model_group().get() : world.get();
      EXPECT_EQ(on.sum_group(), shards) << spec << " with the dp ranks' shards";
    }
    auto barrier = torch::ones({1});
    world->all_reduce(barrier).wait();
  }));
}

}  // namespace
}  // namespace tandem::dist
