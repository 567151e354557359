// What the trainer's files share and nothing else needs (src/engine/trainer*.cpp).
#pragma once

#include <cstdint>

#include <torch/torch.h>

#include "tandem/data/loader.h"
#include "tandem/engine/train_options.h"
#include "tandem/optim/make_optimizer.h"

namespace tandem::engine::internal {

// The loader's options for `batch_size` a step on `workers` threads, its
// batches pinned for a CUDA device.
inline data::LoaderOptions loader_options(int64_t batch_size, int64_t workers, const torch::Device& device) {
  data::LoaderOptions options;
  options.batch_size = batch_size;
  options.workers = workers;
  options.pin_memory = device.is_cuda();
  return options;
}

// The resolved optimizer (--optimizer) with its flags (--lr, --momentum,
// --beta1, ...), for optim::make_optimizer or a data plan's own.
optim::OptimizerSettings optimizer_settings(const TrainOptions& options);

}  // namespace tandem::engine::internal
