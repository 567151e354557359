// tandem/engine/tied_stages.h: a weight that two stages of a pipeline over
// ranks both use (GPT-2's token embedding, read by its head on the last
// stage), kept one weight across them.
//
// Note [tied weights across stages]: every rank builds the whole model, so
// the last stage's head reads its own copy of the embedding (a parameter
// of a piece another rank runs), equal to the first stage's at the start.
// As Megatron-LM does with its embedding group, the copies stay equal
// because each step gives both the same gradient: after the data-parallel
// reduction (which averaged the owner's gradient over its dp ranks, but
// not the copy's, which no data plan holds) the copy's gradient is
// averaged over its own dp ranks, then the owner's and the copy's are
// summed over a group of the two ranks (split from the pipeline's). That
// sum is what one process's autograd sums from the two uses. Both ranks
// then step the weight alike (each keeps its optimizer state; clipping
// counts the copy's gradient on the owner's rank only). Checkpoints hold
// the owner's, as for every parameter; the copy's rank keeps its state
// (drop_others_state spares it) and, on CUDA, its copy on the device.
//
// Note [tied weights under fsdp]: FSDP over the stages (share_owner_shards)
// holds the owner's weight as its dp ranks' shards (each a run of the
// weight's rows), and steps only those, so the copy is kept equal by
// value instead: after the dp
// reduction the copy's gradient, averaged over its dp ranks, is broadcast
// to the owner's rank, which adds to each run it holds that run of it (the
// owner's shards then hold the average of both uses' gradients, as one
// process's autograd sums them); the copy does not step. After each step
// the owner's ranks make the weight whole from their runs (an all-reduce
// of the runs in place over the shard group: each element from its one
// holder, the rest zeros) and the owner's rank broadcasts it to the copy.
// Traffic: the weight twice over the pair and once over the shard group a
// step, as much as the gradient's sum costs without FSDP plus the gather.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/placement.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/data_plan.h"
#include "tandem/models/sequence.h"

namespace tandem::engine {

class TiedStages {
 public:
  // `pieces`: the pipeline's pieces, piece k run by stage k % stages.
  // Null when no piece reads a parameter of a piece on another stage.
  // Every rank of `stages` calls it (it may split the group). `data`: this
  // stage's dp group, or null. Throws tandem::Error for a tied weight that
  // no piece owns.
  static std::unique_ptr<TiedStages> make(const std::vector<models::Sequence>& pieces,
                                          const std::shared_ptr<dist::ProcessGroup>& stages,
                                          std::shared_ptr<dist::ProcessGroup> data, const torch::Device& device);

  // FSDP over the stages: the owners' weights are shards (runs of rows) over
  // `shard_group` (Note [tied weights under fsdp]). Called on every rank
  // of the job, after make.
  void share_owner_shards(std::shared_ptr<dist::ProcessGroup> shard_group);
  // After the dp reduction, before clipping: the copies' gradients
  // summed with the owners' (a collective of the ranks that hold them).
  // `plan`: this rank's data plan, whose placed parameters hold a sharded
  // owner's runs.
  void reduce_gradients(const DataPlan& plan);
  // After the optimizer's step (and at the start): with sharded owners,
  // each copy given its owner's weight; otherwise nothing (both stepped).
  void refresh_copies(const DataPlan& plan);
  // The parameters this rank uses and steps though another stage's piece
  // holds them (the last stage's copy of the embedding).
  const std::vector<torch::Tensor>& borrowed() const { return borrowed_; }
  bool borrows(const torch::Tensor& p) const;
  // For the run's log: what is tied between which stages.
  std::string describe() const { return description_; }

 private:
  struct Tie {
    torch::Tensor weight;  // this rank's: the owner's, or the copy
    bool copy = false;     // this rank reads it in another stage's piece
    std::shared_ptr<dist::ProcessGroup> pair;  // the owner's and the copy's ranks
    int64_t copy_root = 1;                     // the copy's rank in `pair`
    std::vector<int64_t> shape;                // the weight's (FSDP empties the owner's at rest)
  };
  // The whole weight's elements in one flat tensor: zeros, or (with
  // `runs`) this rank's runs of the sharded owner in place.
  torch::Tensor flat_of(const Tie& tie, const std::vector<dist::PlacedTensor>* runs) const;
  std::vector<Tie> ties_;
  std::vector<torch::Tensor> borrowed_;
  std::shared_ptr<dist::ProcessGroup> data_, shard_group_;
  torch::TensorOptions options_;
  std::string description_;
};

}  // namespace tandem::engine
