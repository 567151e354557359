// tandem/engine/mesh_plan.h: the job's mesh as one part of a run: every
// process group of its dimensions, and the parts that split the model
// over them (tensor parallelism's cut, a weight tied across pipeline
// stages), asked at a step's phases without asking which of them the run
// has.
//
//   MeshPlan mesh;                     // built by the Trainer's set-up
//   mesh.reduce_gradients(plan);       // after the dp plan's reduction
//   auto mesh_of = mesh.placement_mesh(plan.sharded());  // a norm's sums
//   mesh.refresh_copies(plan);         // after the optimizer step
//
// Note [mesh plan]: a run's dimensions are three parts behind small
// interfaces: the dp dimension's DataPlan (engine/data_plan.h), the pp
// dimension's StagePlan (engine/stage_plan.h), and this, which holds the
// groups (each null where the run lacks the dimension: a group of one is
// never made) and does what the model's splitting asks of a step and a
// checkpoint. Each operation is a no-op where its dimension is absent, so
// the Trainer calls it unconditionally: the gradient of a weight tied
// across stages joins its owner's (TiedStages), the whole parameters'
// partial gradients are summed over tp under sequence parallelism, tp's
// parts are made whole for a checkpoint and cut again, and the pieces a
// rank holds get their placements over tp (Note [placements]).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "tandem/dist/device_mesh.h"
#include "tandem/dist/placement.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/data_plan.h"
#include "tandem/engine/evaluate.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/task.h"
#include "tandem/engine/train_options.h"
#include "tandem/engine/tied_stages.h"
#include "tandem/models/moe.h"
#include "tandem/models/sequence.h"
#include "tandem/parallel/tensor_parallel_plan.h"

namespace tandem::engine {

struct MeshGroups {
  // Every rank of the job (null for one process).
  std::shared_ptr<dist::ProcessGroup> job;
  // The dp slice through this rank: the ranks holding copies (or FSDP's
  // shards) of the same parameters; null for a pipeline over ranks alone.
  std::shared_ptr<dist::ProcessGroup> data;
  // HSDP (Note [hsdp]): the dp ranks FSDP shards over, and those holding
  // the same shards; null unless --mesh splits dp.
  std::shared_ptr<dist::ProcessGroup> data_shard, data_replicate;
  // The pp slice (Note [pipeline over ranks], [replicated stages]).
  std::shared_ptr<dist::ProcessGroup> pipeline;
  // The tp slice, and the ranks holding one copy of the model between them
  // (the tp group, or under pp x tp the pp x tp slice).
  std::shared_ptr<dist::ProcessGroup> tensor, model;
  // The cp slice (--mesh cp=C): ranks of `data` reading the same samples,
  // each holding part of every sequence. Null without it.
  std::shared_ptr<dist::ProcessGroup> context;
  // Expert parallelism (--mesh ep=E): the ranks of `data` that hold the
  // experts between them, and those holding the same experts as this rank.
  // Null without it.
  std::shared_ptr<dist::ProcessGroup> expert, expert_replicate;
  // pp x dp (x tp) over ranks: the mesh the groups were split from.
  std::shared_ptr<dist::DeviceMesh> mesh;
};

class MeshPlan {
 public:
  MeshGroups groups;
  std::unique_ptr<parallel::TensorParallelPlan> tensor;  // tp > 1 (Note [tensor-parallel plans])
  std::unique_ptr<TiedStages> tied;  // a weight two stages read (Note [tied weights across stages])
  // A pipeline over ranks (Note [pipeline over ranks]): this rank's pieces
  // of the model, in the model's order, and the other ranks' (whose
  // modules this rank holds but does not run).
  std::vector<models::Sequence> own_pieces, others_pieces;

  // The slices of `layout`'s mesh over groups.job, once every rank's
  // settings are known to agree (a collective of the job): under a staged
  // mesh (pp x dp or pp x tp) the pp slice runs the pipeline, the dp slice
  // replicates its stage, the tp slice splits its layers; under dp x tp or
  // HSDP the dp and tp slices. Other layouts keep the groups they have.
  void split_groups(const ParallelLayout& layout);

  // --mesh with tp > 1 (nothing otherwise): the whole model, built and
  // initialised as in one process, cut over the tp group (Note
  // [tensor-parallel plans]). Throws tandem::UsageError naming --mesh or
  // --sequence-parallel for a model or sequence tp cannot split.
  // `seq_len`: the data's (0: images).
  void cut_over_tensor_ranks(models::Sequence& model, const TrainOptions& options, int64_t seq_len);
  // --mesh with cp > 1 (nothing otherwise): the model's attention cut
  // over the cp group (Note [context parallelism]). Throws
  // tandem::UsageError naming --seq-len for sequences 2 cp does not divide.
  void cut_over_context_ranks(models::Sequence& model, const TrainOptions& options, int64_t seq_len);
  // --mesh with ep > 1 (nothing otherwise): every mixture-of-experts
  // layer's experts spread over the ep group (Note [expert dispatch]);
  // their weights leave the dp plan (expert_weights()), whose reduction
  // would mix different experts (mesh_experts.cpp).
  void cut_over_expert_ranks(models::Sequence& model, const TrainOptions& options);
  // The experts' weights this rank holds under ep (empty without it).
  const std::vector<torch::Tensor>& expert_weights() const { return expert_weights_; }
  // Whether `parameter` is one of them (this rank's slice of the experts).
  bool spreads(const torch::Tensor& parameter) const {
    for (const auto& w : expert_weights_) {
      if (w.unsafeGetTensorImpl() == parameter.unsafeGetTensorImpl()) return true;
    }
    return false;
  }
  // After backward: the experts' gradients summed over the ranks holding
  // the same experts and divided by the data ranks, so that each is one
  // process's gradient on the global batch (a collective of
  // groups.expert_replicate; nothing without ep).
  void reduce_expert_gradients();
  // This rank's part of a batch of sequences [B, T] (inputs or targets):
  // the tokens it holds under cp, all of them otherwise.
  torch::Tensor cut_sequence(const torch::Tensor& batch) const;
  // The same for evaluation (engine/evaluate.h).
  SequenceCut sequence_cut() const;
  // The task the model is trained for under this mesh: `plain`, or under
  // tp its loss over the vocabulary's parts.
  std::shared_ptr<const Task> task(std::shared_ptr<const Task> plain, double label_smoothing) const;
  // Where DataPlanSetup's groups and pieces come from.
  void fill(DataPlanSetup& setup) const;
  // Once the dp plan exists (collectives of the job): FSDP's shards given
  // to the tied stages, FSDP's units checked to agree over tp, and under
  // sequence parallelism the tp ranks' pieces of the whole parameters
  // checked to be the same (`placed`: this rank's, with their gradients'
  // placements). `model`, `strategy`: the flags, for the messages.
  void join(DataPlan& plan, const std::string& model, Strategy strategy,
            const std::function<std::vector<dist::PlacedTensor>()>& placed);
  // The groups of the dimensions a step's traffic is counted over, by the
  // names --mesh gives them ("dp", "pp", "tp", "cp", "ep"; a null one where
  // the run lacks it), and "ep_replicate": the ranks holding the same
  // experts, which sum their gradients (Note [expert gradients]). Under
  // HSDP the data dimension's traffic runs over its two splits, the shard
  // groups' and the replicas', counted together under the data
  // dimension's name (they are splits of the dp ranks, not duplicates of
  // their group: nothing is counted twice).
  std::vector<std::pair<std::string, std::shared_ptr<dist::ProcessGroup>>> named_groups() const {
    // The ring's own traffic is "cp".
    const auto data = dist::data_group_name(groups.context ? groups.context->size() : 1);
    return {{data, groups.data},
            {data, groups.data_shard},
            {data, groups.data_replicate},
            {"pp", groups.pipeline},
            {"tp", groups.tensor},
            {"cp", groups.context},
            {"ep", groups.expert},
            {"ep_replicate", groups.expert_replicate}};
  }
  // The ranks whose gradients an fp16 loss scaler checks together: the
  // whole job under a mesh (FSDP's shards and tp's parts differ), a
  // pipeline's stages, or the dp group.
  std::shared_ptr<dist::ProcessGroup> inf_check_group() const;

  // Whether the model's parameters are split beyond the dp dimension: a
  // pipeline's stages over a mesh, or tp's parts.
  bool splits_model() const { return groups.mesh != nullptr || tensor != nullptr; }
  // This rank's pipeline stage (0 without a pipeline over ranks).
  int64_t stage() const { return groups.pipeline ? groups.pipeline->rank() : 0; }

  // Note [placements]: each piece's placement over tp (of its gradient
  // before the tp sum, with `gradients`), and a tied weight's copy marked
  // as another stage's.
  void place(std::vector<dist::PlacedTensor>& pieces, bool gradients) const;
  // The mesh as placements see it; `data_sharded`: the dp ranks hold
  // disjoint pieces (FSDP).
  dist::PlacementMesh placement_mesh(bool data_sharded) const;
  // The cut of a parameter tp splits (Shard), else null.
  const dist::Placement* cut(const torch::Tensor& parameter) const;
  bool borrows(const torch::Tensor& parameter) const { return tied && tied->borrows(parameter); }

  // After the dp plan's reduction: the tied copies' gradients joined with
  // their owners', then the whole parameters' partial gradients (Partial
  // over tp among `placed()`, this rank's pieces with their gradients'
  // placements, asked for only under tp) summed over tp. Collectives of
  // those dimensions.
  void reduce_gradients(const DataPlan& plan, const std::function<std::vector<dist::PlacedTensor>()>& placed);
  // After the optimizer step, and before the first: the tied copies made
  // their owners' again.
  void refresh_copies(const DataPlan& plan);
  // Sums `flags` over the ranks holding other parts of the model (the
  // stages, tp's parts), so that all stop or none (a collective of those).
  void sum_over_model(torch::Tensor& flags) const;

  // The epoch's sums: summed over the dp ranks, then the last stage's (it
  // has the outputs) given to every stage (collectives of those groups).
  void reduce_epoch_sums(torch::Tensor& sums) const;
  // This rank's coordinate along a group of the mesh (0 without it):
  // whether it is the first of its dp replicas (`groups.data`), tp parts
  // (`groups.tensor`), HSDP copies (`groups.data_replicate`), the one
  // that writes what those ranks hold alike.
  static bool first_of(const std::shared_ptr<dist::ProcessGroup>& group) { return !group || group->rank() == 0; }

  // Note [tensor-parallel checkpoints], [expert checkpoints in one file]:
  // every cut parameter and spread expert (and `optimizer`'s state of it,
  // when given) made whole, and cut again.
  void make_whole(torch::optim::Optimizer* optimizer);
  void cut_again(torch::optim::Optimizer* optimizer);
  // The end of training: tp's cut and ep's spread undone, every rank's
  // model whole and plain.
  void finish();

  // A pipeline over ranks (mesh_stages.cpp). Every stage's weights and
  // buffers, and `optimizer`'s state when given, onto every rank of the
  // pipeline (a collective of it; nothing without a pipeline over ranks),
  // before a checkpoint or an export.
  void gather_stages(torch::nn::Module& model, torch::optim::Optimizer* optimizer);
  // Before an export: every stage's weights onto every rank of a pipeline
  // over ranks, with `optimizer`'s state unless tp or ep holds it in parts (a
  // collective of the pipeline; nothing without one).
  void gather_for_export(torch::nn::Module& model, torch::optim::Optimizer* optimizer) {
    gather_stages(model, tensor || experts_spread_ ? nullptr : optimizer);
  }
  // `values` (one per stage, each rank's own filled) summed over a
  // pipeline over ranks (a collective of it); as they are without one.
  void sum_over_stages(std::vector<double>& values) const;
  // Forgets the optimizer state of other ranks' pieces (after a checkpoint
  // gathered or loaded it): holding it would cost this rank the whole
  // model's momentum or moments.
  void drop_others_state(torch::optim::Optimizer& optimizer) const;
  // The parameters other ranks step (their pieces', but a tied copy's):
  // they keep their places in a sharded optimizer.
  std::vector<torch::Tensor> stepped_elsewhere() const;
  // The modules this rank runs: its own pieces, or the whole model.
  std::vector<const torch::nn::Module*> modules_here(const torch::nn::Module& model) const;

 private:
  void gather_experts();  // ep's spread undone (a collective of groups.expert)
  void make_experts_whole(torch::optim::Optimizer* optimizer);
  void cut_experts_again(torch::optim::Optimizer* optimizer);
  std::vector<torch::Tensor> expert_weights_;
  std::vector<torch::Tensor> held_experts_;  // this rank's rows, while make_whole() holds them whole
  std::vector<models::SparseMoeImpl*> spread_layers_;
  bool experts_spread_ = false;  // the run spread them (the optimizer's state stays in parts)
};

}  // namespace tandem::engine
