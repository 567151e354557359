// tandem/plan/image_shape.h: a registry image classifier (convnet, mlp,
// resnet18/34/50, mobilenetv2) as the planner sees it, measured by
// building it and training two steps of it on this machine.
//
// Note [measured image models]: a language model's activations are counted
// from the tensors its layers keep (model_shape.h); a convolutional net's
// depend on every block's strides, channels and fused kernels, so the
// planner measures them instead: the model built at the job's image size,
// a step (forward, loss, backward) timed by the counting allocator at two
// batch sizes after a first step, and its peak over what was live before
// fitted as fixed + per_sample x batch (activations are linear in the
// batch; the fixed part is backward's scratch and the weights' transposes).
// Its FLOPs are libtorch's profiler's count of one forward's products
// (conv2d, addmm, mm, bmm), three times for forward and backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::plan {

struct ImageShape {
  int64_t channels = 3, image_size = 32, classes = 10;
  // Each top-level layer's parameters in order: the pieces FSDP's units
  // are planned from (parallel::plan_units).
  std::vector<std::string> layer_names;
  std::vector<int64_t> layer_numels;
  // Each layer's parameters' shapes: FSDP pads each to whole rows a rank
  // (parallel::plan_shards).
  std::vector<std::vector<std::vector<int64_t>>> layer_shapes;
  int64_t tensors = 0;      // parameter tensors (DDP sends a used flag each)
  double buffer_bytes = 0;  // BatchNorm's running statistics (the data strategies broadcast them)
  // A step's peak over its states, measured (the Note): bytes at a batch of b.
  double activation_bytes_fixed = 0, activation_bytes_per_sample = 0;
  double flops_per_sample = 0;  // forward and backward
};

// `model` built for images of `channels` x `image_size` x `image_size` in
// `classes` classes, in float64 (`float64`) or float32, and measured on one
// thread (the Note). Throws tandem::UsageError naming --model for a model
// that is not a registry image classifier, and naming the sizes for one
// that cannot be built or run at them here (a tensor over a quarter of
// this machine's memory is refused rather than made).
ImageShape measure_image_model(const std::string& model, int64_t channels, int64_t image_size, int64_t classes,
                               bool float64);

}  // namespace tandem::plan
