// tandem/dist/device_mesh.h: the job's ranks as a grid of pipeline stages
// x data-parallel replicas x tensor-parallel shards, with a process group
// for each slice of each dimension.
//
// Layout: pp outermost, tp innermost, as torchtitan and Megatron-LM lay
// them out, so that the ranks of a tensor-parallel group (the most
// traffic) are contiguous and share a node:
//
//   rank = (pp * dp_size + dp) * tp_size + tp
//
//   --mesh pp=2,dp=2,tp=2 (8 ranks)      tp=0  tp=1
//     stage 0   replica 0               0     1
//               replica 1               2     3
//     stage 1   replica 0               4     5
//               replica 1               6     7
//
// The dp slice through rank 5 is {5, 7}; its pp slice {1, 5}; its tp
// slice {4, 5}.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/dist/process_group.h"

namespace tandem::dist {

enum class MeshDim { kPipeline = 0, kData = 1, kTensor = 2 };
inline constexpr std::array<MeshDim, 3> kMeshDims{MeshDim::kPipeline, MeshDim::kData, MeshDim::kTensor};

// "pp", "dp", "tp": the names --mesh gives the dimensions.
const char* mesh_dim_name(MeshDim dim);

// The data dimension's group: "dp", or under context parallelism (cp > 1)
// its dp x cp ranks, "dp_cp" (torchtitan's name). Its traffic is counted,
// and planned, under that name.
inline const char* data_group_name(int64_t cp) { return cp > 1 ? "dp_cp" : "dp"; }

struct MeshShape {
  std::array<int64_t, 3> sizes{1, 1, 1};  // pp, dp, tp
  // HSDP (--mesh dp_replicate=R,dp_shard=S): dp = R x S, dp_shard = S, the
  // dp ranks grouped in R groups of S consecutive ones; 0: dp not split.
  int64_t dp_shard = 0;
  int64_t dp_replicate() const { return dp_shard > 0 ? sizes[1] / (dp_shard * cp) : 1; }
  // Context parallelism (--mesh cp=C, Note [context parallelism] in
  // parallel/context_parallel.h): the data dimension's ranks in groups of
  // C consecutive ones, each group reading the same samples and holding
  // parts of their sequences; sizes[1] = dp x cp. 1: none. Under HSDP,
  // FSDP shards over the dp_shard x cp ranks of a replica group
  // (torchtitan's dp_shard_cp), the groups replicating as before.
  int64_t cp = 1;
  int64_t dp() const { return sizes[1] / cp; }
  // Expert parallelism (--mesh ep=E, Note [expert dispatch] in
  // parallel/expert_parallel.h): the data dimension's dp x cp ranks in
  // groups of E consecutive ones, each group holding every expert once
  // between them; it borrows its ranks from dp x cp and adds none (E
  // divides them). 1: none.
  int64_t ep = 1;
  int64_t operator[](MeshDim dim) const { return sizes[static_cast<size_t>(dim)]; }
  int64_t& operator[](MeshDim dim) { return sizes[static_cast<size_t>(dim)]; }
  int64_t size() const { return sizes[0] * sizes[1] * sizes[2]; }
  // "pp=2,dp=2,tp=1", "pp=1,dp_replicate=2,dp_shard=2,tp=1", "pp=1,dp=2,cp=2,tp=1", "pp=1,dp=4,ep=2,tp=1"
  std::string str() const;
  bool operator==(const MeshShape& other) const {
    return sizes == other.sizes && dp_shard == other.dp_shard && cp == other.cp && ep == other.ep;
  }
};

// --mesh SPEC: comma-separated dim=size, each dimension at most once, an
// omitted one 1; dp, or dp_replicate and dp_shard (HSDP: either may be
// left out, as 1) in its place; ep within dp x cp (without dp, dp is what
// ep needs: ep=2 is dp=2); the sizes' product must be `world` (0: any). Throws tandem::UsageError naming --mesh and what was expected.
MeshShape parse_mesh(const std::string& spec, int64_t world);
// The check parse_mesh makes of `world`, of a shape parsed from `spec`.
void check_mesh_size(const MeshShape& shape, const std::string& spec, int64_t world);

using MeshCoordinates = std::array<int64_t, 3>;  // pp, dp, tp

MeshCoordinates mesh_coordinates(const MeshShape& shape, int64_t rank);
int64_t mesh_rank(const MeshShape& shape, const MeshCoordinates& at);
// The ranks whose coordinates equal `rank`'s but along `dim`: the slice
// through it, in increasing order.
std::vector<int64_t> mesh_slice(const MeshShape& shape, int64_t rank, MeshDim dim);

class DeviceMesh {
 public:
  // Every rank of `world` makes it, with the same shape, whose size is the
  // world's: the shapes are compared over `world` first (a rank started
  // with another --mesh is named), then each dimension's slices split off
  // the world's group (ProcessGroup::split), pp, dp, tp in that order.
  DeviceMesh(std::shared_ptr<ProcessGroup> world, const MeshShape& shape);

  const MeshShape& shape() const { return shape_; }
  const MeshCoordinates& coordinates() const { return coordinates_; }
  int64_t coordinate(MeshDim dim) const { return coordinates_[static_cast<size_t>(dim)]; }
  // The group of this rank's slice along `dim`: its rank there is this
  // rank's coordinate along `dim`. A group of one for a dimension of size 1.
  const std::shared_ptr<ProcessGroup>& group(MeshDim dim) const { return groups_[static_cast<size_t>(dim)]; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // The ranks of this rank's replica: those of its dp coordinate, over the
  // pp and tp dimensions (Megatron-LM's model-parallel group), which
  // together hold one copy of the model. Made with the others when pp > 1
  // and tp > 1; otherwise the pp or the tp group.
  const std::shared_ptr<ProcessGroup>& model_group() const { return model_group_; }
  // HSDP (MeshShape::dp_shard): the S dp ranks of this rank's group, over
  // which FSDP shards, and the R ranks that hold the same shards, over
  // which their gradients are averaged. Null when dp is not split.
  const std::shared_ptr<ProcessGroup>& data_shard_group() const { return data_shard_; }
  // Context parallelism (MeshShape::cp): the cp ranks of this rank's
  // group, which read the same samples. Null without it.
  const std::shared_ptr<ProcessGroup>& context_group() const { return context_; }
  const std::shared_ptr<ProcessGroup>& data_replicate_group() const { return data_replicate_; }
  // Expert parallelism (MeshShape::ep): the ep ranks of this rank's group,
  // which hold the experts between them, and the ranks holding the same
  // experts as this one (over which their gradients are summed). Null
  // without it.
  const std::shared_ptr<ProcessGroup>& expert_group() const { return expert_; }
  const std::shared_ptr<ProcessGroup>& expert_replicate_group() const { return expert_replicate_; }

 private:
  std::shared_ptr<ProcessGroup> world_;
  MeshShape shape_;
  MeshCoordinates coordinates_{};
  std::array<std::shared_ptr<ProcessGroup>, 3> groups_;
  std::shared_ptr<ProcessGroup> model_group_;
  std::shared_ptr<ProcessGroup> data_shard_, data_replicate_, context_, expert_, expert_replicate_;
};

}  // namespace tandem::dist
