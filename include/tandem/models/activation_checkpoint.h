// tandem/models/activation_checkpoint.h: activation checkpointing (PyTorch's
// torch.utils.checkpoint, reentrant form), which libtorch's C++ API lacks.
//
//   auto y = models::checkpoint_activations([&](const torch::Tensor& x) { return block->forward(x); },
//                                           x, block->buffers());
//
// Note [activation checkpointing]: the forward runs without recording an
// autograd graph, so none of the segment's activations are kept; only its
// input is. When backward reaches the segment, it runs the forward again,
// with grad enabled, on the saved input, under the autocast settings and
// the random generator states (CPU, and the input's CUDA device) that the
// first forward had, and back-propagates the incoming gradient through that
// graph: the parameters' gradients accumulate as without checkpointing (the
// same operations on the same values), and the input's gradient flows on.
// Memory: one segment's activations at a time instead of all of them, for
// one more forward of each checkpointed segment.
//  - `buffers` are the segment's state that a training forward updates
//    (BatchNorm's running statistics): they are put back after the
//    recomputation, which would otherwise update them twice.
//  - The output requires grad even when the input does not (the first
//    segment, fed the data): an empty anchor tensor that requires grad is
//    an input too, so backward still reaches the parameters. Without it no
//    checkpointed segment would get gradients, since each one's input comes
//    from the one before (PyTorch's reentrant checkpoint warns of exactly
//    that).
//  - A segment that talks to other ranks in its forward (SyncBatchNorm)
//    would do so again, out of order with the backward's reductions: the
//    trainer refuses --checkpoint-activations with --sync-bn.
#pragma once

#include <functional>
#include <vector>

#include <torch/types.h>

namespace tandem::models {

using SegmentFn = std::function<torch::Tensor(const torch::Tensor&)>;

// fn(input), its activations recomputed in backward instead of kept. With
// grad mode off it is just fn(input).
torch::Tensor checkpoint_activations(SegmentFn fn, const torch::Tensor& input,
                                     std::vector<torch::Tensor> buffers = {});

// Sizes of `segments` contiguous runs of `children` top-level children, as
// even as possible (the first ones one longer), as checkpoint_sequential
// cuts them. Throws tandem::Error unless 1 <= segments <= children.
std::vector<int64_t> plan_segments(int64_t children, int64_t segments);

}  // namespace tandem::models
