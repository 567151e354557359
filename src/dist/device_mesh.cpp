#include "tandem/dist/device_mesh.h"

#include <algorithm>
#include <limits>

#include "tandem/util/check.h"
#include "tandem/util/parse.h"

namespace tandem::dist {

const char* mesh_dim_name(MeshDim dim) {
  switch (dim) {
    case MeshDim::kPipeline:
      return "pp";
    case MeshDim::kData:
      return "dp";
    case MeshDim::kTensor:
      return "tp";
  }
  return "?";
}

std::string MeshShape::str() const {
  std::string text;
  for (MeshDim dim : kMeshDims) {
    text += text.empty() ? "" : ",";
    if (dim == MeshDim::kData && dp_shard > 0) {
      text += "dp_replicate=" + std::to_string(dp_replicate()) + ",dp_shard=" + std::to_string(dp_shard);
      if (cp > 1) text += ",cp=" + std::to_string(cp);
    } else if (dim == MeshDim::kData && cp > 1) {
      text += "dp=" + std::to_string(dp()) + ",cp=" + std::to_string(cp);
    } else {
      text += std::string(mesh_dim_name(dim)) + "=" + std::to_string((*this)[dim]);
    }
    if (dim == MeshDim::kData && ep > 1) text += ",ep=" + std::to_string(ep);
  }
  return text;
}

MeshShape parse_mesh(const std::string& spec, int64_t world) {
  const std::string flag = "--mesh " + spec;
  TANDEM_CHECK_USAGE(!spec.empty(), "--mesh: expected dimensions such as dp=2,pp=2 (pp, dp, cp, ep, tp), got nothing");
  MeshShape shape;
  // pp, dp, tp, then HSDP's dp_replicate and dp_shard, then cp, then ep.
  const std::array<const char*, 7> names{"pp", "dp", "tp", "dp_replicate", "dp_shard", "cp", "ep"};
  std::array<int64_t, 7> given{0, 0, 0, 0, 0, 0, 0};
  for (const auto& part : split(spec, ',')) {
    const auto equals = part.find('=');
    TANDEM_CHECK_USAGE(equals != std::string::npos, flag, ": expected dim=size, such as dp=2, got '", part, "'");
    const std::string name = part.substr(0, equals);
    const auto found = std::find(names.begin(), names.end(), name);
    TANDEM_CHECK_USAGE(found != names.end(), flag, ": unknown dimension '", name,
                       "' (expected pp, dp, cp, ep, tp, or dp_replicate and dp_shard in place of dp)");
    const auto index = static_cast<size_t>(found - names.begin());
    TANDEM_CHECK_USAGE(given[index] == 0, flag, ": ", name, " given twice");
    const auto size = parse_int(part.substr(equals + 1));
    TANDEM_CHECK_USAGE(size && *size >= 1 && *size <= (int64_t{1} << 20), flag, ": ", name,
                       " expected a whole number of ranks >= 1, got '", part.substr(equals + 1), "'");
    given[index] = *size;
  }
  for (size_t i = 0; i < 3; ++i) shape.sizes[i] = std::max<int64_t>(given[i], 1);
  if (given[3] > 0 || given[4] > 0) {
    TANDEM_CHECK_USAGE(given[1] == 0, flag, ": dp with dp_replicate or dp_shard; give dp=N, or dp_replicate=R,"
                       "dp_shard=S for HSDP (dp = R x S)");
    const int64_t replicas = std::max<int64_t>(given[3], 1);
    shape.dp_shard = std::max<int64_t>(given[4], 1);
    shape.sizes[1] = replicas * shape.dp_shard;
  }
  if (given[5] > 1) {
    shape.cp = given[5];
    shape.sizes[1] *= shape.cp;
  }
  if (given[6] > 1) {
    shape.ep = given[6];
    TANDEM_CHECK_USAGE(shape.dp_shard == 0, flag, ": ep with dp_replicate or dp_shard (HSDP) is not available "
                       "yet; give dp=N,ep=E");
    // ep borrows from dp x cp; without dp, dp is what ep needs.
    if (given[1] == 0 && shape.ep > shape.sizes[1] && shape.ep % shape.cp == 0) shape.sizes[1] = shape.ep;
    TANDEM_CHECK_USAGE(shape.sizes[1] % shape.ep == 0, flag, ": ep=", shape.ep, " must divide the ", shape.sizes[1],
                       " ranks of dp x cp (", shape.dp(), " x ", shape.cp, "), whose ranks it spreads the experts over");
  }
  check_mesh_size(shape, spec, world);
  return shape;
}

void check_mesh_size(const MeshShape& shape, const std::string& spec, int64_t world) {
  TANDEM_CHECK_USAGE(world == 0 || shape.size() == world, "--mesh ", spec, ": ", shape.str(), " is a mesh of ",
                     shape.size(), " ranks, but the job has ", world, " (the sizes' product must be the world size)");
}

MeshCoordinates mesh_coordinates(const MeshShape& shape, int64_t rank) {
  TANDEM_CHECK(rank >= 0 && rank < shape.size(), "rank ", rank, " is not in a mesh of ", shape.size(), " ranks");
  const int64_t tp = shape[MeshDim::kTensor], dp = shape[MeshDim::kData];
  return {rank / (dp * tp), (rank / tp) % dp, rank % tp};
}

int64_t mesh_rank(const MeshShape& shape, const MeshCoordinates& at) {
  for (MeshDim dim : kMeshDims) {
    const auto i = static_cast<size_t>(dim);
    TANDEM_CHECK(at[i] >= 0 && at[i] < shape[dim], mesh_dim_name(dim), " coordinate ", at[i], " is not in ",
                 shape.str());
  }
  return (at[0] * shape[MeshDim::kData] + at[1]) * shape[MeshDim::kTensor] + at[2];
}

std::vector<int64_t> mesh_slice(const MeshShape& shape, int64_t rank, MeshDim dim) {
  auto at = mesh_coordinates(shape, rank);
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < shape[dim]; ++i) {
    at[static_cast<size_t>(dim)] = i;
    ranks.push_back(mesh_rank(shape, at));
  }
  return ranks;  // increasing: the rank grows with every coordinate
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape)
    : world_(std::move(world)), shape_(shape) {
  TANDEM_CHECK(world_ != nullptr, "a device mesh needs the job's process group");
  TANDEM_CHECK(shape_.size() == world_->size(), "--mesh ", shape_.str(), ": a mesh of ", shape_.size(),
               " ranks, but the job has ", world_->size());
  // Note [same mesh]: a rank that lays the ranks out otherwise would join
  // other slices, and its groups would wait for ranks that never come.
  std::vector<int64_t> mine(shape_.sizes.begin(), shape_.sizes.end());
  mine.push_back(shape_.dp_shard);
  mine.push_back(shape_.cp);
  mine.push_back(shape_.ep);
  auto sizes = torch::tensor(mine, torch::kInt64);
  std::vector<torch::Tensor> all;
  for (int64_t r = 0; r < world_->size(); ++r) all.push_back(torch::empty_like(sizes));
  world_->all_gather(all, sizes).wait();
  for (int64_t r = 0; r < world_->size(); ++r) {
    MeshShape theirs;
    for (size_t i = 0; i < 3; ++i) theirs.sizes[i] = all[static_cast<size_t>(r)][static_cast<int64_t>(i)].item<int64_t>();
    theirs.dp_shard = all[static_cast<size_t>(r)][3].item<int64_t>();
    theirs.cp = all[static_cast<size_t>(r)][4].item<int64_t>();
    theirs.ep = all[static_cast<size_t>(r)][5].item<int64_t>();
    TANDEM_CHECK(theirs == shape_, "--mesh: rank ", r, " lays the ranks out as ", theirs.str(), ", rank ",
                 world_->rank(), " as ", shape_.str(), ": every rank must be given the same --mesh");
  }
  coordinates_ = mesh_coordinates(shape_, world_->rank());
  for (MeshDim dim : kMeshDims) {
    const std::string name = dim == MeshDim::kData ? data_group_name(shape_.cp) : mesh_dim_name(dim);
    groups_[static_cast<size_t>(dim)] = world_->split(name, mesh_slice(shape_, world_->rank(), dim));
  }
  const int64_t pp = shape_[MeshDim::kPipeline], tp = shape_[MeshDim::kTensor];
  if (pp > 1 && tp > 1) {
    std::vector<int64_t> ranks;  // increasing: pp outer, tp inner
    for (int64_t s = 0; s < pp; ++s) {
      for (int64_t t = 0; t < tp; ++t) ranks.push_back(mesh_rank(shape_, {s, coordinate(MeshDim::kData), t}));
    }
    model_group_ = world_->split("model", ranks);
  } else {
    model_group_ = group(pp > 1 ? MeshDim::kPipeline : MeshDim::kTensor);
  }
  if (shape_.dp_shard > 0) {
    // HSDP: dp coordinate d is replica group d / S, shard d % S; under cp
    // FSDP shards over the S x cp ranks of a replica (cp's inside them).
    const int64_t shards = shape_.dp_shard * shape_.cp, d = coordinate(MeshDim::kData);
    std::vector<int64_t> same_replica, same_shard;
    for (int64_t other = 0; other < shape_[MeshDim::kData]; ++other) {
      auto at = coordinates_;
      at[static_cast<size_t>(MeshDim::kData)] = other;
      if (other / shards == d / shards) same_replica.push_back(mesh_rank(shape_, at));
      if (other % shards == d % shards) same_shard.push_back(mesh_rank(shape_, at));
    }
    data_shard_ = world_->split("dp_shard", same_replica);
    data_replicate_ = world_->split("dp_replicate", same_shard);
  }
  if (shape_.cp > 1) {
    // Context parallelism: dp coordinate d is context group d / cp.
    const int64_t d = coordinate(MeshDim::kData);
    std::vector<int64_t> same_samples;
    for (int64_t other = d / shape_.cp * shape_.cp; other < (d / shape_.cp + 1) * shape_.cp; ++other) {
      auto at = coordinates_;
      at[static_cast<size_t>(MeshDim::kData)] = other;
      same_samples.push_back(mesh_rank(shape_, at));
    }
    context_ = world_->split("cp", same_samples);
  }
  if (shape_.ep > 1) {
    // Expert parallelism: dp coordinate d is in expert group d / ep, and
    // holds the experts of the others with the same d % ep.
    const int64_t d = coordinate(MeshDim::kData);
    std::vector<int64_t> same_group, same_experts;
    for (int64_t other = 0; other < shape_[MeshDim::kData]; ++other) {
      auto at = coordinates_;
      at[static_cast<size_t>(MeshDim::kData)] = other;
      if (other / shape_.ep == d / shape_.ep) same_group.push_back(mesh_rank(shape_, at));
      if (other % shape_.ep == d % shape_.ep) same_experts.push_back(mesh_rank(shape_, at));
    }
    expert_ = world_->split("ep", same_group);
    expert_replicate_ = world_->split("ep_replicate", same_experts);
  }
}

}  // namespace tandem::dist
