// tandem/optim/zero.h: SGD or AdamW whose state is sharded over the ranks
// of a data-parallel group (ZeRO stage 1; PyTorch's ZeroRedundancyOptimizer).
//
//   parallel::DistributedDataParallel ddp(model.ptr(), group);
//   optim::ZeroSgd optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9), group);
//   ... forward, backward (DDP averages the gradients) ...
//   optimizer.step();   // steps this rank's share, then every rank gets every parameter
//
// Note [sharded optimizer state]: after DDP's all-reduce every rank holds
// the same averaged gradients, and a plain optimizer has every rank make the
// same update to every parameter, each keeping a momentum buffer as large as
// the model. Here each parameter tensor has one owner (plan_shards): only
// the owner keeps its momentum buffer and updates it, and each owner then
// broadcasts its share, so the others receive the values they would have
// computed. With several ranks, each owner's parameters (per device and
// dtype) are moved at construction into one flat buffer and become views
// of it, in their own strides (PyTorch's parameters_as_bucket_view), so a
// share goes out in one broadcast per buffer, all started before any is
// waited for, with no packing or unpacking; a parameter that is not dense
// (none of tandem's models has one) goes through a coalesced broadcast.
// Construct it after the model has its final device, dtype and memory
// format: moving the model later replaces the views. The update of each
// parameter is Sgd's own arithmetic on the same inputs, so the weights are
// bit-identical to Sgd's on every rank (tests/optim/zero_test.cpp); a rank
// holds about 1/W of the state.
// The price is communication: the broadcasts move the parameters once more
// per step (all-reduce plus broadcast: about 1.5 times DDP's bytes), the
// trade PyTorch's ZeroRedundancyOptimizer makes too.
//
// Checkpoints hold the whole state in Sgd's form: consolidate_state() (a
// collective: every rank calls it) gives every rank every buffer, save()
// refuses to write before it, and the next step() or shard_state() drops
// the others' buffers again. load() takes a whole state (written by Sgd or
// by a ZeroSgd on any number of ranks) and keeps this rank's share. So a
// run may resume with or without sharding, on another world size.
//
// Every rank constructs it with the same parameters in the same order and
// calls step() at the same steps (the broadcasts are collectives); whether a
// parameter has a gradient must agree across ranks, as it does after DDP.
// Ownership is fixed at construction: a parameter group added later is an
// error at the next step.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "tandem/dist/process_group.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"

namespace tandem::optim {

// The owner rank of each of `numels` parameter tensors, in their order, over
// `world` ranks: largest first, each to the rank with the fewest elements so
// far (ties: the lower rank, then the earlier tensor), as PyTorch's
// ZeroRedundancyOptimizer partitions. Pure and deterministic, so every rank
// computes the same plan. `loads`, when given, holds each rank's elements
// so far and is updated (ZeroSgd plans one parameter group after another
// with it, as PyTorch does). Throws tandem::Error for world < 1, a negative
// size, or loads of another length than world.
std::vector<int64_t> plan_shards(const std::vector<int64_t>& numels, int64_t world,
                                 std::vector<int64_t>* loads = nullptr);

// What the trainer asks of a sharded optimizer, whatever it steps.
class ShardedState {
 public:
  virtual ~ShardedState() = default;
  // Every rank receives every parameter's state (a collective); save() may then write.
  virtual void consolidate_state() = 0;
  // Drops the state of parameters this rank does not own.
  virtual void shard_state() = 0;
  virtual bool consolidated() const = 0;
  virtual int64_t rank() const = 0;
  virtual int64_t world_size() const = 0;
  // The owner of `p`; throws tandem::Error for a parameter the plan does not know.
  virtual int64_t owner(const torch::Tensor& p) const = 0;
  // Elements of the parameters each rank owns (its state's, when it has one).
  virtual std::vector<int64_t> shard_numels() const = 0;
};

// `Base` (Sgd or AdamW) with its state sharded: each parameter stepped by
// its owner alone, then broadcast from it.
template <class Base>
class ZeroRedundancy : public Base, public ShardedState {
 public:
  // `params`: tensors or parameter groups; `options`: Base's. `group` may
  // be null: one rank, which owns everything (plain Base). `elsewhere`:
  // parameters among `params` that other ranks than the group's step (a
  // pipeline's other stages): they keep their place in the state's layout,
  // so a checkpoint of the whole model loads, but are never stepped, sent
  // or given state here (owner() is kElsewhere). `own`: parameters whose
  // values differ over the group (the experts each rank holds under
  // expert parallelism): every rank steps and keeps the state of its own,
  // and sends none of them (owner() is kOwnEverywhere).
  template <class Options>
  ZeroRedundancy(std::vector<torch::Tensor> params, Options options, std::shared_ptr<dist::ProcessGroup> group,
                 const std::vector<torch::Tensor>& elsewhere = {}, const std::vector<torch::Tensor>& own = {})
      : Base(std::move(params), std::move(options)), group_(std::move(group)) {
    plan(elsewhere, own);
  }
  template <class Options>
  ZeroRedundancy(std::vector<torch::optim::OptimizerParamGroup> groups, Options options,
                 std::shared_ptr<dist::ProcessGroup> group, const std::vector<torch::Tensor>& elsewhere = {},
                 const std::vector<torch::Tensor>& own = {})
      : Base(std::move(groups), std::move(options)), group_(std::move(group)) {
    plan(elsewhere, own);
  }
  static constexpr int64_t kElsewhere = -1, kOwnEverywhere = -2;

  // Steps this rank's share (Base::step), then broadcasts every share from
  // its owner. A collective.
  torch::Tensor step(torch::optim::Optimizer::LossClosure closure = nullptr) override;

  void consolidate_state() override;
  void shard_state() override;
  bool consolidated() const override { return consolidated_; }

  // The whole state, as Base writes it; throws tandem::Error unless
  // consolidate_state() ran since the last step (with several ranks).
  void save(torch::serialize::OutputArchive& archive) const override;
  // A whole state (Base's form); this rank keeps its share.
  void load(torch::serialize::InputArchive& archive) override;

  int64_t rank() const override { return rank_; }
  int64_t world_size() const override { return world_; }
  int64_t owner(const torch::Tensor& p) const override;
  std::vector<int64_t> shard_numels() const override;
  // The flat buffers the shares' parameters are views of (several ranks only).
  std::vector<torch::Tensor> flat_buffers() const;

 protected:
  bool steps_parameter(const torch::Tensor& p) const override { return keeps_state(owner(p)); }

 private:
  bool keeps_state(int64_t owner) const { return owner == rank_ || owner == kOwnEverywhere; }
  void plan(const std::vector<torch::Tensor>& elsewhere, const std::vector<torch::Tensor>& own);
  std::vector<torch::Tensor> all_parameters() const;  // every group's, in order

  std::shared_ptr<dist::ProcessGroup> group_;
  int64_t rank_ = 0, world_ = 1;
  std::unordered_map<const c10::TensorImpl*, int64_t> owner_;
  std::vector<std::vector<torch::Tensor>> shares_;  // per rank, its parameters in order
  struct Flat {
    int64_t owner;
    torch::Tensor buffer;  // the owner's parameters of one device and dtype are views of it
  };
  std::vector<Flat> flats_;
  std::vector<std::vector<torch::Tensor>> loose_;  // per rank: parameters not in a flat buffer
  bool consolidated_ = false;
};

// SGD's momentum sharded (the trainer's --shard-optimizer), and AdamW's
// step and moments (with --optimizer adamw).
using ZeroSgd = ZeroRedundancy<Sgd>;
using ZeroAdamW = ZeroRedundancy<AdamW>;

}  // namespace tandem::optim
