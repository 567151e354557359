// The device mesh: --mesh parsed or named, the ranks laid out pp-outermost
// and tp-innermost, one group per slice whose collectives stay in it, and
// a timeout in a slice naming the job's rank that did not come.
#include <chrono>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tandem/dist/communication_error.h"
#include "tandem/dist/device_mesh.h"
#include "testing.h"

namespace tandem::dist {
namespace {

std::string usage_error_of(const std::string& spec, int64_t world) {
  try {
    parse_mesh(spec, world);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(DeviceMeshTest, TheFlagIsParsedOrNamed) {
  EXPECT_EQ(parse_mesh("dp=2,pp=2", 4).str(), "pp=2,dp=2,tp=1");
  EXPECT_EQ(parse_mesh("tp=2", 2).str(), "pp=1,dp=1,tp=2");
  EXPECT_EQ(parse_mesh("pp=2,dp=3,tp=2", 12).size(), 12);
  EXPECT_EQ(usage_error_of("dp=3", 4), "--mesh dp=3: pp=1,dp=3,tp=1 is a mesh of 3 ranks, but the job has 4 (the "
                                       "sizes' product must be the world size)");
  EXPECT_EQ(usage_error_of("dp=2,dp=2", 4), "--mesh dp=2,dp=2: dp given twice");
  EXPECT_EQ(usage_error_of("xp=2", 2), "--mesh xp=2: unknown dimension 'xp' (expected pp, dp, cp, ep, tp, or "
                                      "dp_replicate and dp_shard in place of dp)");
  EXPECT_EQ(usage_error_of("dp=0", 1), "--mesh dp=0: dp expected a whole number of ranks >= 1, got '0'");
  EXPECT_EQ(usage_error_of("dp=two", 2), "--mesh dp=two: dp expected a whole number of ranks >= 1, got 'two'");
  EXPECT_EQ(usage_error_of("dp", 2), "--mesh dp: expected dim=size, such as dp=2, got 'dp'");
  EXPECT_EQ(usage_error_of("", 2), "--mesh: expected dimensions such as dp=2,pp=2 (pp, dp, cp, ep, tp), got nothing");
  // ep: borrowed from dp x cp, adding no ranks; without dp, dp is what it needs.
  EXPECT_EQ(parse_mesh("ep=2", 2).str(), "pp=1,dp=2,ep=2,tp=1");
  EXPECT_EQ(parse_mesh("dp=4,ep=2", 4).str(), "pp=1,dp=4,ep=2,tp=1");
  EXPECT_EQ(parse_mesh("cp=2,ep=2", 2).str(), "pp=1,dp=1,cp=2,ep=2,tp=1");
  EXPECT_EQ(parse_mesh("ep=4,cp=2", 4).str(), "pp=1,dp=2,cp=2,ep=4,tp=1");
  EXPECT_EQ(usage_error_of("dp=3,ep=2", 3), "--mesh dp=3,ep=2: ep=2 must divide the 3 ranks of dp x cp (3 x 1), "
                                            "whose ranks it spreads the experts over");
  // cp: the data dimension's ranks in groups of cp (dp x cp of them).
  const auto context = parse_mesh("cp=2,dp=3", 6);
  EXPECT_EQ(context.str(), "pp=1,dp=3,cp=2,tp=1");
  EXPECT_EQ(context[MeshDim::kData], 6);
  EXPECT_EQ(context.dp(), 3);
  const auto hybrid = parse_mesh("dp_replicate=2,dp_shard=2,cp=2", 8);
  EXPECT_EQ(hybrid.str(), "pp=1,dp_replicate=2,dp_shard=2,cp=2,tp=1");
  EXPECT_EQ(hybrid.dp_replicate(), 2);
  EXPECT_EQ(hybrid.dp(), 4);
  EXPECT_EQ(usage_error_of("dp=2,cp=2", 2), "--mesh dp=2,cp=2: pp=1,dp=2,cp=2,tp=1 is a mesh of 4 ranks, but the "
                                            "job has 2 (the sizes' product must be the world size)");
}

// The picture in tandem/dist/device_mesh.h, and for every rank of a
// 2 x 3 x 2 mesh: its coordinates give it back, and each dimension's
// slices partition the ranks, each slice varying only that coordinate.
TEST(DeviceMeshTest, PipelineIsOutermostAndTensorInnermost) {
  const auto picture = parse_mesh("pp=2,dp=2,tp=2", 8);
  EXPECT_EQ(mesh_slice(picture, 5, MeshDim::kData), (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(mesh_slice(picture, 5, MeshDim::kPipeline), (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(mesh_slice(picture, 5, MeshDim::kTensor), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(mesh_coordinates(picture, 6), (MeshCoordinates{1, 1, 0}));
  const auto shape = parse_mesh("pp=2,dp=3,tp=2", 12);
  for (MeshDim dim : kMeshDims) {
    std::set<int64_t> covered;
    for (int64_t rank = 0; rank < shape.size(); ++rank) {
      EXPECT_EQ(mesh_rank(shape, mesh_coordinates(shape, rank)), rank);
      const auto slice = mesh_slice(shape, rank, dim);
      ASSERT_EQ(static_cast<int64_t>(slice.size()), shape[dim]);
      EXPECT_EQ(slice[static_cast<size_t>(mesh_coordinates(shape, rank)[static_cast<size_t>(dim)])], rank);
      for (int64_t other : slice) {
        EXPECT_EQ(mesh_slice(shape, other, dim), slice) << "the slice through " << rank;
        for (MeshDim d : kMeshDims) {
          if (d != dim) {
            EXPECT_EQ(mesh_coordinates(shape, other)[static_cast<size_t>(d)],
                      mesh_coordinates(shape, rank)[static_cast<size_t>(d)]);
          }
        }
      }
      covered.insert(slice.begin(), slice.end());
    }
    EXPECT_EQ(static_cast<int64_t>(covered.size()), shape.size());
  }
  // tp contiguous: the tp slices of rank 2k are {2k, 2k + 1}.
  EXPECT_EQ(mesh_slice(shape, 10, MeshDim::kTensor), (std::vector<int64_t>{10, 11}));
}

// 4 ranks as dp=2,pp=2: a sum over a slice's group is the sum of that
// slice's ranks alone; a broadcast from its rank 0 brings that slice's
// first rank; the world's group still spans all four.
TEST(DeviceMeshTest, EachSlicesCollectivesStayInIt) {
  testing::expect_no_errors(testing::run_ranks(4, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("dp=2,pp=2", 4));
    const int64_t rank = world->rank();
    EXPECT_EQ(mesh.coordinates(), mesh_coordinates(mesh.shape(), rank));
    for (MeshDim dim : kMeshDims) {
      const auto& group = mesh.group(dim);
      const auto slice = mesh_slice(mesh.shape(), rank, dim);
      EXPECT_EQ(group->size(), static_cast<int64_t>(slice.size()));
      EXPECT_EQ(group->rank(), mesh.coordinate(dim));
      EXPECT_EQ(group->job_ranks(), slice);
      auto sum = torch::full({2}, static_cast<double>(1 << rank), torch::kFloat64);
      group->all_reduce(sum).wait();
      double want = 0;
      for (int64_t r : slice) want += static_cast<double>(1 << r);
      EXPECT_EQ(sum[1].item<double>(), want) << mesh_dim_name(dim) << " on rank " << rank;
      auto first = torch::full({1}, static_cast<double>(rank), torch::kFloat64);
      group->broadcast(first, 0).wait();
      EXPECT_EQ(first.item<double>(), static_cast<double>(slice.front()));
    }
    auto all = torch::ones({1});
    mesh.world()->all_reduce(all).wait();
    EXPECT_EQ(all.item<float>(), 4.0f);
  }));
}

// The model group of pp=2,dp=2,tp=2 (8 ranks): the pp x tp ranks of this
// rank's dp coordinate, e.g. {0, 1, 4, 5} for ranks 0, 1, 4 and 5; with tp
// 1 it is the pp group, with pp 1 the tp group.
TEST(DeviceMeshTest, TheModelGroupIsOneReplicasRanks) {
  testing::expect_no_errors(testing::run_ranks(8, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("pp=2,dp=2,tp=2", 8));
    const int64_t dp = mesh.coordinate(MeshDim::kData);
    const std::vector<int64_t> want = dp == 0 ? std::vector<int64_t>{0, 1, 4, 5} : std::vector<int64_t>{2, 3, 6, 7};
    EXPECT_EQ(mesh.model_group()->job_ranks(), want);
    auto sum = torch::full({1}, static_cast<double>(1 << world->rank()), torch::kFloat64);
    mesh.model_group()->all_reduce(sum).wait();
    double expected = 0;
    for (int64_t r : want) expected += static_cast<double>(1 << r);
    EXPECT_EQ(sum.item<double>(), expected);
  }));
  testing::expect_no_errors(testing::run_ranks(4, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh piped(world, parse_mesh("dp=2,pp=2", 4));
    EXPECT_EQ(piped.model_group(), piped.group(MeshDim::kPipeline));
    DeviceMesh split(world, parse_mesh("dp=2,tp=2", 4));
    EXPECT_EQ(split.model_group(), split.group(MeshDim::kTensor));
    auto barrier = torch::ones({1});  // no rank lets its groups go while another still joins them
    world->all_reduce(barrier).wait();
  }));
}

// HSDP's dp_replicate and dp_shard split dp (either alone: the other 1),
// never beside dp; the shape says so when printed and compared.
TEST(DeviceMeshTest, HsdpSplitsTheDataDimension) {
  const auto hsdp = parse_mesh("dp_shard=2,dp_replicate=3,tp=2", 12);
  EXPECT_EQ(hsdp[MeshDim::kData], 6);
  EXPECT_EQ(hsdp.dp_shard, 2);
  EXPECT_EQ(hsdp.dp_replicate(), 3);
  EXPECT_EQ(hsdp.str(), "pp=1,dp_replicate=3,dp_shard=2,tp=2");
  EXPECT_EQ(parse_mesh("dp_replicate=4", 4).str(), "pp=1,dp_replicate=4,dp_shard=1,tp=1");
  EXPECT_EQ(parse_mesh("dp_shard=4", 4).str(), "pp=1,dp_replicate=1,dp_shard=4,tp=1");
  EXPECT_FALSE(parse_mesh("dp_shard=4", 4) == parse_mesh("dp=4", 4));
  EXPECT_EQ(usage_error_of("dp=2,dp_shard=2", 4), "--mesh dp=2,dp_shard=2: dp with dp_replicate or dp_shard; give "
                                                 "dp=N, or dp_replicate=R,dp_shard=S for HSDP (dp = R x S)");
  EXPECT_EQ(usage_error_of("dp_replicate=2,dp_shard=2", 8), "--mesh dp_replicate=2,dp_shard=2: pp=1,dp_replicate=2,"
                                                           "dp_shard=2,tp=1 is a mesh of 4 ranks, but the job has 8 "
                                                           "(the sizes' product must be the world size)");
}

// pp=2 x dp_replicate=2 x dp_shard=2 (8 ranks): the shard group of a rank
// is its replica group's S consecutive dp ranks, its replicate group the
// ranks of the same shard in the other replica groups; each group's sum
// stays in it.
TEST(DeviceMeshTest, HsdpGroupsAreTheShardsAndTheirReplicas) {
  testing::expect_no_errors(testing::run_ranks(8, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("pp=2,dp_replicate=2,dp_shard=2", 8));
    const int64_t pp = mesh.coordinate(MeshDim::kPipeline), dp = mesh.coordinate(MeshDim::kData);
    const int64_t base = pp * 4;  // dp ranks of this stage: base + dp
    const std::vector<int64_t> shards = {base + dp / 2 * 2, base + dp / 2 * 2 + 1};
    const std::vector<int64_t> replicas = {base + dp % 2, base + dp % 2 + 2};
    EXPECT_EQ(mesh.data_shard_group()->job_ranks(), shards);
    EXPECT_EQ(mesh.data_replicate_group()->job_ranks(), replicas);
    EXPECT_EQ(mesh.data_shard_group()->rank(), dp % 2);
    EXPECT_EQ(mesh.data_replicate_group()->rank(), dp / 2);
    auto sum = torch::full({1}, static_cast<double>(1 << world->rank()), torch::kFloat64);
    mesh.data_replicate_group()->all_reduce(sum).wait();
    EXPECT_EQ(sum.item<double>(), static_cast<double>((1 << replicas[0]) + (1 << replicas[1])));
    mesh.data_shard_group()->all_reduce(sum).wait();  // every group used before any is let go
    world->all_reduce(sum).wait();
  }));
  testing::expect_no_errors(testing::run_ranks(2, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh plain(world, parse_mesh("dp=2", 2));
    EXPECT_EQ(plain.data_shard_group(), nullptr);
    EXPECT_EQ(plain.data_replicate_group(), nullptr);
    auto barrier = torch::ones({1});
    world->all_reduce(barrier).wait();
  }));
}

// ep=2 over dp=4 (per stage): expert groups of consecutive dp ranks, and
// the ranks holding the same experts across them.
TEST(DeviceMeshTest, EpGroupsAreConsecutiveDataRanksAndTheirReplicas) {
  testing::expect_no_errors(testing::run_ranks(8, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("pp=2,dp=4,ep=2", 8));
    const int64_t pp = mesh.coordinate(MeshDim::kPipeline), dp = mesh.coordinate(MeshDim::kData);
    const int64_t base = pp * 4;
    EXPECT_EQ(mesh.expert_group()->job_ranks(), (std::vector<int64_t>{base + dp / 2 * 2, base + dp / 2 * 2 + 1}));
    EXPECT_EQ(mesh.expert_replicate_group()->job_ranks(), (std::vector<int64_t>{base + dp % 2, base + dp % 2 + 2}));
    EXPECT_EQ(mesh.expert_group()->rank(), dp % 2);
    auto sum = torch::ones({1});
    mesh.expert_group()->all_reduce(sum).wait();
    mesh.expert_replicate_group()->all_reduce(sum).wait();
    world->all_reduce(sum).wait();
  }));
}

// Note [same mesh]: a rank given another --mesh is named on every rank.
TEST(DeviceMeshTest, ARankWithAnotherMeshIsNamed) {
  const auto errors = testing::run_ranks(2, [](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh(world->rank() == 1 ? "pp=2" : "dp=2", 2));
  });
  EXPECT_EQ(errors[0], "--mesh: rank 1 lays the ranks out as pp=2,dp=1,tp=1, rank 0 as pp=1,dp=2,tp=1: every "
                       "rank must be given the same --mesh");
  EXPECT_NE(errors[1].find("--mesh: rank 0 lays the ranks out as pp=1,dp=2,tp=1, rank 1 as pp=2,dp=1,tp=1"),
            std::string::npos) << errors[1];
}

// Note [splits]: in the dp group of ranks 2 and 3, rank 3 never comes to
// the all_reduce; rank 2's timeout names rank 3 by its rank in the job
// (it is rank 1 of that group), and says which group it waited in.
TEST(DeviceMeshTest, ATimeoutInASliceNamesTheJobsRank) {
  std::promise<void> failed;
  auto done = failed.get_future().share();
  GroupOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  std::string message;
  std::vector<int64_t> unanswered;
  testing::expect_no_errors(testing::run_ranks(
      4,
      [&](std::shared_ptr<ProcessGroup> world) {
        DeviceMesh mesh(world, parse_mesh("dp=2,pp=2", 4));
        if (world->rank() == 2) {
          auto t = torch::ones({1});
          try {
            mesh.group(MeshDim::kData)->all_reduce(t).wait();
            ADD_FAILURE() << "the all_reduce finished without rank 3";
          } catch (const CommunicationError& e) {
            message = e.what();
            unanswered = e.unanswered();
          }
          failed.set_value();
        } else {
          done.wait();  // rank 0 keeps the store up until rank 2 has its verdict
        }
      },
      options));
  EXPECT_NE(message.find("all_reduce on rank 2 (0 of 2 in the dp group of ranks 2 and 3) (gloo) failed"),
            std::string::npos) << message;
  EXPECT_NE(message.find("rank 3 did not report reaching this all_reduce"), std::string::npos) << message;
  EXPECT_EQ(unanswered, (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace tandem::dist
