// The mesh's groups and the parts that split the model (mesh_plan.h).
#include "tandem/engine/mesh_plan.h"

#include "tandem/parallel/context_parallel.h"
#include "tandem/parallel/fsdp.h"

#include "tandem/dist/collectives.h"
#include "tandem/util/check.h"

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
    g.context = g.mesh->context_group();
    g.expert = g.mesh->expert_group();
    g.expert_replicate = g.mesh->expert_replicate_group();
  } else if (tensor_ranks ||
             (g.job && (layout.mesh.dp_shard > 0 || layout.context_ranks() > 1 || layout.mesh.ep > 1))) {
    // dp x tp, HSDP, cp, ep
    dist::DeviceMesh mesh(g.job, layout.mesh);
    g.data = mesh.group(dist::MeshDim::kData);
    if (tensor_ranks) g.tensor = g.model = mesh.group(dist::MeshDim::kTensor);
    g.data_shard = mesh.data_shard_group();
    g.data_replicate = mesh.data_replicate_group();
    g.context = mesh.context_group();
    g.expert = mesh.expert_group();
    g.expert_replicate = mesh.expert_replicate_group();
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
  reduce_expert_gradients();  // Note [expert gradients]
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

void MeshPlan::reduce_epoch_sums(torch::Tensor& sums) const {
  if (groups.data) groups.data->all_reduce(sums).wait();
  if (groups.pipeline) groups.pipeline->broadcast(sums, groups.pipeline->size() - 1).wait();
}

void MeshPlan::make_whole(torch::optim::Optimizer* optimizer) {
  if (tensor) tensor->make_whole(optimizer);  // tp's parts first: ep gathers experts of whole features
  make_experts_whole(optimizer);
}

void MeshPlan::cut_again(torch::optim::Optimizer* optimizer) {
  cut_experts_again(optimizer);
  if (tensor) tensor->cut_again(optimizer);
}

void MeshPlan::finish() {
  if (tensor && !tensor->detached()) tensor->detach();
  if (!spread_layers_.empty()) gather_experts();
}

void MeshPlan::cut_over_tensor_ranks(models::Sequence& model, const TrainOptions& o, int64_t seq_len) {
  if (!groups.tensor) return;
  TANDEM_CHECK_USAGE(seq_len > 0, "--mesh ", o.mesh.text(), ": tensor parallelism splits a language model's layers; ",
                     o.model, " is an image classifier");  // (parallel_layout refuses it first)
  try {
    const int64_t tp = groups.tensor->size();
    TANDEM_CHECK_USAGE(!o.sequence_parallel || seq_len % tp == 0, "--sequence-parallel: sequences of ", seq_len,
                       " tokens (--seq-len) do not split into ", tp, " equal parts over tp=", tp);
    parallel::TensorParallelPlanOptions plan_options;
    plan_options.sequence_parallel = o.sequence_parallel;
    tensor = std::make_unique<parallel::TensorParallelPlan>(model, groups.tensor, plan_options);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError("--mesh " + o.mesh.text() + ": " + e.what());
  }
}

void MeshPlan::cut_over_context_ranks(models::Sequence& model, const TrainOptions& o, int64_t seq_len) {
  if (!groups.context) return;
  TANDEM_CHECK_USAGE(seq_len > 0, "--mesh ", o.mesh.text(), ": context parallelism splits a language model's "
                     "sequences; ", o.model, " is an image classifier");  // (parallel_layout refuses it first)
  check_context_seq_len(seq_len, groups.context->size(), o.mesh.text());
  parallel::split_context(model, groups.context);
}

torch::Tensor MeshPlan::cut_sequence(const torch::Tensor& batch) const {
  if (!groups.context) return batch;
  return parallel::context_part(batch, 1, groups.context->rank(), groups.context->size());
}

SequenceCut MeshPlan::sequence_cut() const {
  if (!groups.context) return {};
  return {groups.context->size(), [this](const torch::Tensor& batch) { return cut_sequence(batch); }};
}

std::shared_ptr<const Task> MeshPlan::task(std::shared_ptr<const Task> plain, double label_smoothing) const {
  return tensor ? vocab_parallel_language_model_task(*tensor, label_smoothing) : std::move(plain);
}

void MeshPlan::fill(DataPlanSetup& setup) const {
  if (groups.mesh) setup.pieces = own_pieces;  // Note [replicated stages]
  setup.group = groups.data;
  setup.left_out = expert_weights_;  // Note [expert gradients]
  setup.shard_group = groups.data_shard;
  setup.replicate_group = groups.data_replicate;
}

void MeshPlan::join(DataPlan& plan, const std::string& model, Strategy strategy,
                    const std::function<std::vector<dist::PlacedTensor>()>& placed) {
  if (tied && plan.sharded()) tied->share_owner_shards(groups.data_shard ? groups.data_shard : groups.data);
  if (!tensor) return;
  if (auto* fsdp = plan.fully_sharded()) {
    // FSDP with tp: each tp coordinate's dp ranks shard their own parts, and
    // the tp collectives in the layers run between FSDP's gathers; tp ranks
    // whose parts group into other units would gather at other points and
    // could wait on each other. Parts that tp divides evenly always agree.
    std::vector<int64_t> ends;
    for (const auto& unit : fsdp->units()) ends.push_back(static_cast<int64_t>(unit.end));
    TANDEM_CHECK_USAGE(dist::same_on_every_rank(ends, *groups.tensor), "--strategy fsdp with tp: the tp ranks' parts "
                       "of ", model, " group into different FSDP units (their sizes differ where tp does not divide a "
                       "dimension); give --fsdp-min-unit-params 0 (every layer a unit)");
  }
  if (tensor->partial_gradients()) {
    // The whole parameters' partial gradients are summed over tp piece by
    // piece (Note [sequence-parallel plans]). A whole parameter has the
    // same shape on every tp rank, and so the same pieces: under FSDP its
    // Shard(0) rows depend on its shape and dp alone (Note [fsdp shards]).
    // Checked once, as every rank of the job learns.
    const bool here = dist::same_pieces(placed(), &dist::PlacedTensor::tensor_parallel, *groups.tensor);
    auto same = torch::tensor({here ? 1 : 0}, torch::kInt64).to(groups.job->wire_device());
    groups.job->all_reduce(same, dist::ReduceOp::kMin).wait();
    TANDEM_CHECK(same.item<int64_t>() == 1, "tp with --strategy ", strategy, ": the tp ranks hold different pieces "
                 "of ", model, "'s whole parameters, whose gradients are summed over tp");
  }
}

std::shared_ptr<dist::ProcessGroup> MeshPlan::inf_check_group() const {
  return groups.mesh || groups.tensor ? groups.job : groups.pipeline ? groups.pipeline : groups.data;
}

}  // namespace tandem::engine
