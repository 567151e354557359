// tandem/parallel/fsdp_optimizer.h: SGD or AdamW over FSDP's shards, whose
// checkpoints are those of the plain optimizer over the whole model.
//
//   FullyShardedDataParallel fsdp(model, group);
//   FsdpAdamW optimizer(fsdp, torch::optim::AdamWOptions(6e-4).weight_decay(0.1));
//   ... steps ...
//   optimizer.consolidate_state();          // every rank (a collective)
//   if (rank == 0) optimizer.save(archive);  // AdamW's form, over model->parameters()
//
// Note [fsdp optimizer state]: stepping the shards is the plain optimizer:
// SGD's and AdamW's updates are elementwise, so a shard's momentum (or
// moments) is the slice of the whole model's, and every shard steps at the
// same steps (FSDP gives each a gradient, zeros for a unit that got none),
// so AdamW's step count is the same for all. A checkpoint, though, must
// not depend on the world size or on FSDP, so save() writes the state the
// plain optimizer over model->parameters() would hold (SGD's one group;
// AdamW's decay_groups): consolidate_state() all-gathers each state tensor
// shaped like the shards into tensors shaped like the parameters
// (FullyShardedDataParallel::gather_like_parameters). load() reads such a
// state (from a plain run, DDP, ZeRO-1 or FSDP on any number of ranks) and
// keeps this rank's slices, with no collective. So a run may resume with
// or without FSDP, on another world size.
//
// Note [fsdp weight decay]: each shard has its parameter's dimensions (its
// rows of it), so FsdpAdamW groups the shards as plain AdamW groups the
// parameters (optim::decay_groups: matrices decayed, vectors not), and
// each group's options are the plain optimizer's group's, group for group:
// a checkpoint's options load into it unchanged, and the weights stay
// bit-identical to plain AdamW's. SGD decays every parameter (tandem's
// plain Sgd does): one group.
#pragma once

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"
#include "tandem/parallel/fsdp.h"

namespace tandem::parallel {

// One parameter's optimizer state as named tensors (optim/state_tensors.h);
// empty: none yet.
using NamedState = std::vector<std::pair<std::string, torch::Tensor>>;

// What the trainer asks of an optimizer over FSDP's shards, whatever it steps.
class FsdpState {
 public:
  virtual ~FsdpState() = default;
  // Every rank gathers the whole state (a collective); save() may then
  // write. The next step() drops it again.
  virtual void consolidate_state() = 0;
  virtual bool consolidated() const = 0;
  // After consolidate_state(): each of fsdp.model_parameters()'s state, in
  // their order (all empty when there is none yet).
  virtual const std::vector<NamedState>& full_state() const = 0;
  // Keeps this rank's slices of `state` (per fsdp.model_parameters(): all
  // empty, or all with every slot); no collective. load() ends with it.
  virtual void load_full_state(const std::vector<NamedState>& state) = 0;
};

template <class Base>
class FullyShardedOptimizer : public Base, public FsdpState {
 public:
  // Steps fsdp.parameters(); `fsdp` must outlive it. `options`: Base's.
  // AdamW: in decay groups by the parameters' shapes (Note [fsdp weight
  // decay]).
  template <class Options>
  FullyShardedOptimizer(FullyShardedDataParallel& fsdp, Options options)
      : Base(groups(fsdp, options), std::move(options)), fsdp_(fsdp) {}

  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override;

  void consolidate_state() override;
  bool consolidated() const override { return consolidated_; }
  const std::vector<NamedState>& full_state() const override { return full_state_; }
  void load_full_state(const std::vector<NamedState>& state) override;

  // The state of the plain optimizer over model->parameters(); throws
  // tandem::Error unless consolidate_state() ran since the last step (with
  // several ranks).
  void save(torch::serialize::OutputArchive& archive) const override;
  // A state of the plain optimizer over model->parameters(); this rank
  // keeps its shards' slices of it.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  template <class Options>
  static std::vector<torch::optim::OptimizerParamGroup> groups(FullyShardedDataParallel& fsdp, const Options& options) {
    if constexpr (std::is_same_v<Base, optim::AdamW>) {
      return optim::decay_groups(fsdp.parameters(), fsdp.parameter_shapes(), options);
    } else {
      return {torch::optim::OptimizerParamGroup(fsdp.parameters())};
    }
  }
  // The plain optimizer over fsdp.model_parameters(), with this one's
  // options (AdamW: in decay groups by the parameters' own shapes).
  std::unique_ptr<Base> whole() const;

  FullyShardedDataParallel& fsdp_;
  bool consolidated_ = false;
  std::vector<NamedState> full_state_;  // after consolidate_state(): per model parameter
};

using FsdpSgd = FullyShardedOptimizer<optim::Sgd>;
using FsdpAdamW = FullyShardedOptimizer<optim::AdamW>;

}  // namespace tandem::parallel
