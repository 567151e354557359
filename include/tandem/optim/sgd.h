// tandem/optim/sgd.h: SGD with libtorch's arithmetic and state, stepped with
// foreach kernels, and capturable in a CUDA graph.
//
//   optim::Sgd optimizer(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
//
// A drop-in torch::optim::SGD: the same options, the same momentum buffers
// under the same keys (so checkpoints written by either load into the
// other), the same update
//   d = g + weight_decay * p;  buf = momentum * buf + (1 - dampening) * d
//   (buf = d on a parameter's first step);  d = nesterov ? d + momentum * buf : buf
//   p -= lr * d
// but each line is one _foreach kernel per (device, dtype) group of
// parameters instead of one kernel per parameter: on CUDA that is a handful
// of launches a step instead of hundreds (PyTorch's foreach=True, its
// default there). On the CPU the foreach ops run per tensor, so the results
// are bit-identical to torch::optim::SGD's (tests/optim/sgd_test.cpp).
//
// Note [learning rate in a tensor]: a step captured in a CUDA graph
// (engine/cuda_graph.h) replays the kernels it captured with the scalars
// they had, so a scheduled learning rate cannot be a scalar argument. After
// use_lr_tensor(), step() reads -lr from a one-element tensor on the
// parameters' device, in their dtype, which set_lr() (optim/schedule.h) refills with a
// kernel of its own before each step, outside the graph. Making a momentum
// buffer is not capturable (a replay would re-copy it from the gradient every
// step), so every parameter must already have one when the capture begins:
// eager steps make them, and freeze_state() (CudaGraphStep's before_capture)
// turns a parameter still without one into an error instead.
#pragma once

#include <torch/optim/sgd.h>

namespace tandem::optim {

class Sgd : public torch::optim::SGD {
 public:
  using torch::optim::SGD::SGD;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // Note [learning rate in a tensor]. All parameters must share one device
  // and dtype.
  void use_lr_tensor();
  // Writes the current learning rate of the first group into the tensor
  // (set_lr calls it); all groups must share one learning rate.
  void refresh_lr_tensor();
  bool has_lr_tensor() const { return neg_lr_.defined(); }
  // From now on step() makes no new state: a parameter with a gradient and
  // no momentum buffer is an error (Note [learning rate in a tensor]).
  void freeze_state() { frozen_ = true; }
  bool state_frozen() const { return frozen_; }

 protected:
  // Whether step() updates `p` (ZeroSgd steps only its rank's share).
  virtual bool steps_parameter(const torch::Tensor& /*p*/) const { return true; }

 private:
  torch::Tensor neg_lr_;  // -lr, on the parameters' device
  bool frozen_ = false;
};

}  // namespace tandem::optim
