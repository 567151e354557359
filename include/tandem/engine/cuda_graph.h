// tandem/engine/cuda_graph.h: a whole training step captured once as a CUDA
// graph and replayed (--cuda-graph).
//
//   auto options = engine::capture_options_for(optimizer);  // an optim::Sgd
//   engine::CudaGraphStep graphed(device, [&](const torch::Tensor& x, const torch::Tensor& y) {
//     optimizer.zero_grad();                   // set to none: backward assigns
//     auto logits = model->forward(x);
//     auto loss = torch::nn::functional::cross_entropy(logits, y);
//     loss.backward();
//     optimizer.step();                        // optim::Sgd with use_lr_tensor()
//     return engine::StepOutputs{logits, loss};
//   }, options);
//   for (batch : loader) { optim::set_lr(optimizer, lr); auto out = graphed.run(x, y); ... }
//
// A replay launches every kernel of the step at once, from one host call:
// what it saves is the host's time to launch them one by one, which is what
// bounds small models and small batches on a fast GPU.
//
// Note [what a captured step may do]: capture records kernels, it does not
// run them, and a replay repeats exactly those kernels on the same memory
// with the same scalar arguments. So the step must
//   - read everything that changes between steps from device memory: the
//     inputs (copied into the graph's static input tensors before a replay),
//     the learning rate (optim::Sgd's learning-rate tensor);
//   - never wait for the device on the host (.item(), a data-dependent shape,
//     a host-side branch on a tensor's value, a loss scaler that skips
//     steps): capture fails, and run() turns that into an error that says so;
//   - keep its state in tensors that live on (parameters, momentum buffers,
//     BatchNorm statistics): made in the eager warm-up steps, never inside
//     the captured one (CudaGraphOptions::before_capture can check that).
// The gradients are set to none before the captured backward, so the graph's
// backward assigns them (into its private memory pool) instead of adding.
// Autocast's cache of cast weights is off during the capture (casts cached
// there would be stale on replay), for every step function.
//
// Note [streams of a graphed step]: the warm-up steps and the capture run on
// a side stream (capture is not allowed on the default stream, and cuBLAS
// keeps a workspace per stream, which the warm-up creates outside the
// capture); the side stream first waits for the current stream and the
// current stream then waits for it (events). Replays run on the current
// stream, after the copies into the static inputs. The capture is
// thread-local: other threads (the loader's workers pinning memory) may go on
// calling CUDA while it runs; the autograd engine's thread still launches
// its kernels on the side stream, so backward is captured too.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include <torch/types.h>

#include "tandem/optim/sgd.h"

namespace tandem::engine {

struct StepOutputs {
  torch::Tensor logits, loss;
};

// One training step on (inputs, targets): forward, loss, backward, optimizer.
using StepFunction = std::function<StepOutputs(const torch::Tensor& inputs, const torch::Tensor& targets)>;

struct CudaGraphOptions {
  int64_t warmup_steps = 3;  // eager steps before the capture
  // Called once, after the warm-up and right before the capture begins: the
  // place to freeze state that a captured step may not make (optim::Sgd::
  // freeze_state). May throw; run() passes the error on.
  std::function<void()> before_capture;
};

// Readies `optimizer` for a captured step and returns `options` with its
// before_capture hook extended: the learning rate moves into a device tensor
// now (Sgd::use_lr_tensor; optim::set_lr refills it before each replay), and
// the state is frozen right before the capture (Sgd::freeze_state), so that
// a parameter still without a momentum buffer is an error instead of a
// buffer the replay would never update. Call it before the first step.
inline CudaGraphOptions capture_options_for(optim::Sgd& optimizer, CudaGraphOptions options = {}) {
  optimizer.use_lr_tensor();
  auto before = std::move(options.before_capture);
  options.before_capture = [&optimizer, before] {
    if (before) before();
    optimizer.freeze_state();
  };
  return options;
}

// Whether this build of tandem can capture CUDA graphs (it was built against
// a CUDA libtorch).
bool cuda_graphs_built();

class CudaGraphStep {
 public:
  // Throws tandem::Error unless `device` is a CUDA device and
  // cuda_graphs_built().
  CudaGraphStep(torch::Device device, StepFunction step, CudaGraphOptions options = {});
  ~CudaGraphStep();
  CudaGraphStep(const CudaGraphStep&) = delete;
  CudaGraphStep& operator=(const CudaGraphStep&) = delete;

  // One step on (inputs, targets), both on the device: the first
  // warmup_steps calls eagerly, then the first batch of the first call's
  // shape is captured and replayed, later ones replay. A batch of another
  // shape or dtype than the captured one (an epoch's short last batch) runs
  // eagerly. The outputs of a replay are the
  // graph's own tensors, overwritten by the next replay (use them before, or
  // clone them). A step that cannot be captured throws tandem::Error
  // (Note [what a captured step may do]).
  StepOutputs run(const torch::Tensor& inputs, const torch::Tensor& targets);

  bool captured() const;
  int64_t replays() const;
  int64_t eager_steps() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::engine
