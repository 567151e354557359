// The mesh's groups and the parts that split the model (mesh_plan.h).
#include "tandem/engine/mesh_plan.h"

namespace tandem::engine {

void MeshPlan::split_groups(const ParallelLayout& layout) {
  auto& g = groups;
  const bool tensor_ranks = layout.tensor_ranks() > 1;
  if (layout.staged_mesh()) {
    g.mesh = std::make_shared<dist::DeviceMesh>(g.job, layout.mesh);
    g.pipeline = g.mesh->group(dist::MeshDim::kPipeline);
    g.data = g.mesh->group(dist::MeshDim::kData);
    if (tensor_ranks) g.tensor = g.mesh->group(dist::MeshDim::kTensor);
    g.model = g.mesh->model_group();
    g.data_shard = g.mesh->data_shard_group();
    g.data_replicate = g.mesh->data_replicate_group();
  } else if (tensor_ranks || (layout.mesh.dp_shard > 0 && g.job)) {  // dp x tp, HSDP
    dist::DeviceMesh mesh(g.job, layout.mesh);
    g.data = mesh.group(dist::MeshDim::kData);
    if (tensor_ranks) g.tensor = g.model = mesh.group(dist::MeshDim::kTensor);
    g.data_shard = mesh.data_shard_group();
    g.data_replicate = mesh.data_replicate_group();
  }
}

void MeshPlan::place(std::vector<dist::PlacedTensor>& pieces, bool gradients) const {
  for (auto& t : pieces) {
    if (tensor) {
      t.tensor_parallel = gradients ? tensor->gradient_placement(t.model_parameter) : tensor->cut(t.model_parameter);
    }
    if (borrows(t.model_parameter)) t.owned = false;
  }
}

dist::PlacementMesh MeshPlan::placement_mesh(bool data_sharded) const {
  return dist::PlacementMesh{groups.job,    groups.pipeline, groups.data_shard ? groups.data_shard : groups.data,
                             groups.tensor, groups.model,    data_sharded,
                             groups.data_replicate};
}

const dist::Placement* MeshPlan::cut(const torch::Tensor& parameter) const {
  if (!tensor) return nullptr;
  const auto& placement = tensor->cut(parameter);
  return placement.is_shard() ? &placement : nullptr;
}

void MeshPlan::reduce_gradients(const DataPlan& plan,
                                const std::function<std::vector<dist::PlacedTensor>()>& placed) {
  if (tied) tied->reduce_gradients(plan);  // Note [tied weights across stages]
  if (tensor) {  // Note [sequence-parallel plans]: whole parameters' partial sums
    dist::sum_partial_gradients(placed(), &dist::PlacedTensor::tensor_parallel, *groups.tensor);
  }
}

void MeshPlan::refresh_copies(const DataPlan& plan) {
  if (tied) tied->refresh_copies(plan);  // Note [tied weights under fsdp]
}

void MeshPlan::sum_over_model(torch::Tensor& flags) const {
  if (groups.pipeline) groups.pipeline->all_reduce(flags).wait();
  if (groups.tensor) groups.tensor->all_reduce(flags).wait();
}

void MeshPlan::make_whole(torch::optim::Optimizer* optimizer) {
  if (tensor) tensor->make_whole(optimizer);
}

void MeshPlan::cut_again(torch::optim::Optimizer* optimizer) {
  if (tensor) tensor->cut_again(optimizer);
}

void MeshPlan::finish() {
  if (tensor && !tensor->detached()) tensor->detach();
}

}  // namespace tandem::engine
