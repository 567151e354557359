// tandem/optim/state_tensors.h: an optimizer's per-parameter state as
// named tensors, whatever the optimizer, for the code that moves state
// between ranks and files (sharded checkpoints, a pipeline's stages
// gathered).
//
//   SGD (optim/sgd.h)      momentum_buffer
//   AdamW (optim/adamw.h)  step (0-dim int64), exp_avg, exp_avg_sq,
//                          max_exp_avg_sq (with amsgrad)
//
// The names are libtorch's state keys (and PyTorch's), so a checkpoint's
// "optimizer.<parameter>.<name>" says what it holds.
#pragma once

#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/optim/optimizer.h>

namespace tandem::optim {

// What a parameter's state holds once it has one: each name with its
// shape and dtype (the parameter's for a moment; step a 0-dim int64), in
// a fixed order. Throws tandem::Error for an optimizer other than SGD or
// AdamW.
struct StateSlot {
  std::string name;
  std::vector<int64_t> shape;
  torch::ScalarType dtype;
};
std::vector<StateSlot> state_slots(const torch::optim::Optimizer& optimizer, const torch::Tensor& p);
// The same for a parameter of `shape` that holds no elements now (FSDP's at rest).
std::vector<StateSlot> state_slots(const torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                                   c10::IntArrayRef shape);

// The largest number of slots any parameter's state has (a checkpoint
// numbers its tensors with it).
constexpr int64_t kMaxStateSlots = 4;

// `p`'s state as named tensors, in state_slots' order; empty when it has
// none yet.
std::vector<std::pair<std::string, torch::Tensor>> parameter_state(const torch::optim::Optimizer& optimizer,
                                                                   const torch::Tensor& p);

// Makes (or replaces) `p`'s state from `named` (every slot of
// state_slots), each tensor moved to the parameter's device. Throws
// tandem::Error naming a missing slot or a shape that does not fit.
void set_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                         const std::map<std::string, torch::Tensor>& named);
// The same for a parameter of `shape` that holds no elements now.
void set_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                         const std::map<std::string, torch::Tensor>& named, c10::IntArrayRef shape);

// `p`'s state tensors of `shape` replaced by `map` of them, the others (a
// step count) kept; nothing when `p` has no state yet. What a parameter
// made whole from its parts, or cut again, does to its state.
void map_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p, c10::IntArrayRef shape,
                         const std::function<torch::Tensor(const torch::Tensor&)>& map);

}  // namespace tandem::optim
