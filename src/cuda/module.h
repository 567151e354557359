// The CUDA module's parts (tandem/cuda/parts.h), one file each; parts.cpp
// gathers them into the struct the module exports.
#pragma once

#include "tandem/cuda/parts.h"
#include "tandem/engine/cuda_graph.h"

namespace tandem::cuda {

c10::intrusive_ptr<c10d::Backend> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout);
extern const bool kNcclBuilt;

std::unique_ptr<GraphRunner> graph_step(torch::Device device, engine::StepFunction step,
                                        const engine::CudaGraphOptions& options);

std::string device_name(int index);

}  // namespace tandem::cuda
