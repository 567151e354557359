// tandem/parallel/fsdp_sgd.h: SGD over FSDP's shards whose checkpoints are
// those of plain SGD over the whole model.
//
//   FullyShardedDataParallel fsdp(model, group);
//   FsdpSgd optimizer(fsdp, torch::optim::SGDOptions(0.1).momentum(0.9));
//   ... steps ...
//   optimizer.consolidate_state();          // every rank (a collective)
//   if (rank == 0) optimizer.save(archive);  // Sgd's form, over model->parameters()
//
// Note [fsdp optimizer state]: stepping the shards is plain Sgd: the update
// is elementwise, so a shard's momentum is the slice of the whole model's.
// A checkpoint, though, must not depend on the world size or on FSDP, so
// save() writes the state that optim::Sgd over model->parameters() would
// hold: consolidate_state() all-gathers every shard's momentum into
// tensors shaped like the parameters (FullyShardedDataParallel::
// gather_like_parameters), and save() writes them under the parameters'
// keys, with the current learning rate and options. load() reads such a
// state (from a plain run, a DDP run, or FSDP on any number of ranks) and
// keeps this rank's slices, with no collective. So a run may resume with or
// without FSDP, on another world size.
#pragma once

#include "tandem/optim/sgd.h"
#include "tandem/parallel/fsdp.h"

namespace tandem::parallel {

class FsdpSgd : public optim::Sgd {
 public:
  // Steps fsdp.parameters(); `fsdp` must outlive it.
  FsdpSgd(FullyShardedDataParallel& fsdp, torch::optim::SGDOptions options);

  // Every rank gathers the whole momentum (a collective); save() may then
  // write. The next step() drops it again.
  void consolidate_state();
  bool consolidated() const { return consolidated_; }

  // The state of optim::Sgd over model->parameters(); throws tandem::Error
  // unless consolidate_state() ran since the last step (with several ranks).
  void save(torch::serialize::OutputArchive& archive) const override;
  // A state of optim::Sgd over model->parameters(); this rank keeps its
  // shards' slices of it.
  void load(torch::serialize::InputArchive& archive) override;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // After consolidate_state(): the whole momentum, per
  // fsdp.model_parameters() (empty when there is none yet).
  const std::vector<torch::Tensor>& full_momentum() const { return full_momentum_; }
  // Keeps this rank's slices of `momentum` (per fsdp.model_parameters(),
  // or empty: no momentum yet); no collective. load() ends with it.
  void load_full_momentum(const std::vector<torch::Tensor>& momentum);

 private:
  FullyShardedDataParallel& fsdp_;
  bool consolidated_ = false;
  std::vector<torch::Tensor> full_momentum_;  // after consolidate_state(): per model parameter
};

}  // namespace tandem::parallel
