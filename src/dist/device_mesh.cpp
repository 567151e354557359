#include "tandem/dist/device_mesh.h"

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
    text += (text.empty() ? "" : ",") + std::string(mesh_dim_name(dim)) + "=" + std::to_string((*this)[dim]);
  }
  return text;
}

MeshShape parse_mesh(const std::string& spec, int64_t world) {
  const std::string flag = "--mesh " + spec;
  TANDEM_CHECK_USAGE(!spec.empty(), "--mesh: expected dimensions such as dp=2,pp=2 (pp, dp, tp), got nothing");
  MeshShape shape;
  std::array<bool, 3> seen{};
  for (const auto& part : split(spec, ',')) {
    const auto equals = part.find('=');
    TANDEM_CHECK_USAGE(equals != std::string::npos, flag, ": expected dim=size, such as dp=2, got '", part, "'");
    const std::string name = part.substr(0, equals);
    int index = -1;
    for (MeshDim dim : kMeshDims) {
      if (name == mesh_dim_name(dim)) index = static_cast<int>(dim);
    }
    TANDEM_CHECK_USAGE(index >= 0, flag, ": unknown dimension '", name, "' (expected pp, dp or tp)");
    TANDEM_CHECK_USAGE(!seen[static_cast<size_t>(index)], flag, ": ", name, " given twice");
    seen[static_cast<size_t>(index)] = true;
    const auto size = parse_int(part.substr(equals + 1));
    TANDEM_CHECK_USAGE(size && *size >= 1 && *size <= (int64_t{1} << 20), flag, ": ", name,
                       " expected a whole number of ranks >= 1, got '", part.substr(equals + 1), "'");
    shape.sizes[static_cast<size_t>(index)] = *size;
  }
  TANDEM_CHECK_USAGE(world == 0 || shape.size() == world, flag, ": ", shape.str(), " is a mesh of ", shape.size(),
                     " ranks, but the job has ", world, " (the sizes' product must be the world size)");
  return shape;
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
  auto sizes = torch::tensor(std::vector<int64_t>(shape_.sizes.begin(), shape_.sizes.end()), torch::kInt64);
  std::vector<torch::Tensor> all;
  for (int64_t r = 0; r < world_->size(); ++r) all.push_back(torch::empty_like(sizes));
  world_->all_gather(all, sizes).wait();
  for (int64_t r = 0; r < world_->size(); ++r) {
    MeshShape theirs;
    for (size_t i = 0; i < 3; ++i) theirs.sizes[i] = all[static_cast<size_t>(r)][static_cast<int64_t>(i)].item<int64_t>();
    TANDEM_CHECK(theirs == shape_, "--mesh: rank ", r, " lays the ranks out as ", theirs.str(), ", rank ",
                 world_->rank(), " as ", shape_.str(), ": every rank must be given the same --mesh");
  }
  coordinates_ = mesh_coordinates(shape_, world_->rank());
  for (MeshDim dim : kMeshDims) {
    groups_[static_cast<size_t>(dim)] = world_->split(mesh_dim_name(dim), mesh_slice(shape_, world_->rank(), dim));
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
}

}  // namespace tandem::dist
