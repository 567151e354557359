// tandem/optim/clip.h: gradient clipping by the global norm, for parameters
// on any number of devices.
//
//   loss.backward();                          // (and DDP's after_backward())
//   auto norm = optim::clip_grad_norm(model->parameters(), 1.0);
//   optimizer.step();
//
// PyTorch's torch.nn.utils.clip_grad_norm_ (its foreach form, norm 2): the
// 2-norm of all gradients taken together, then every gradient multiplied by
// min(1, max_norm / (norm + 1e-6)). Parameters without a gradient are left
// out. A non-finite norm is not an error (PyTorch's default): the gradients
// become non-finite, which the fp16 scaler then skips.
//
// Why not libtorch's torch::nn::utils::clip_grad_norm_: it stacks the
// per-gradient norms on one device, so it fails for a model cut into
// pipeline stages on several devices, and it waits for the device to return
// a double. Here the norms are taken per (device, dtype) group with foreach
// kernels, only each group's partial norm moves to the first gradient's
// device, and nothing waits on the host: a CUDA graph may capture it.
//
// With DDP, clip after after_backward(): every rank then holds the same
// averaged gradients and computes the same norm. With the fp16 scaler,
// unscale first (GradScaler::unscale), or the norm is the scaled one.
// With FSDP (parallel/fsdp.h) each rank holds a shard of every gradient:
// pass the group as `sharded_over`, and the squares summed on each rank are
// all-reduced, so every rank clips with the norm of the whole gradient (a
// collective then: every rank calls it).
#pragma once

#include <vector>

#include <torch/types.h>

#include "tandem/dist/process_group.h"

namespace tandem::optim {

// Clips the gradients in place; returns their global 2-norm before clipping
// (a 0-dim tensor on the first gradient's device; 0 on the CPU when no
// parameter has a gradient). Throws tandem::Error unless max_norm is a
// positive finite number. `also_scaled`: parameters whose gradients are
// clipped with the others but not counted in the norm, because another
// rank of `sharded_over` counts the same gradient (a pipeline's copy of a
// tied embedding: Note [tied weights across stages]).
torch::Tensor clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                             dist::ProcessGroup* sharded_over = nullptr,
                             const std::vector<torch::Tensor>& also_scaled = {});

// The same over gradients themselves (views of a flat gradient, say):
// `counted` make the norm and are clipped, `also_scaled` are clipped only.
torch::Tensor clip_gradients(const std::vector<torch::Tensor>& counted, double max_norm,
                             dist::ProcessGroup* sharded_over = nullptr,
                             const std::vector<torch::Tensor>& also_scaled = {});

}  // namespace tandem::optim
