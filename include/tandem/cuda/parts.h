// tandem/cuda/parts.h: what the CUDA module (libtandem_cuda.so, src/cuda/)
// gives the rest of tandem (Note [CUDA as a module] in
// tandem/util/cuda_module.h). The module and the libraries are built from one
// tree; kPartsVersion (tandem/util/cuda_module.h) changes with this
// struct, and a module of another version is refused rather than called.
//
// Everything here is header-only on tandem's side (the module links no part
// of tandem): its errors are tandem::Error, thrown from inline code.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <c10/util/intrusive_ptr.h>
#include <torch/types.h>

#include "tandem/util/cuda_module.h"

// Declared only: the dist layer includes this header too, below the engine's
// (tandem/engine/cuda_graph.h defines these).
namespace c10d {
class Backend;
class Store;
}  // namespace c10d
namespace tandem::engine {
struct StepOutputs;
struct CudaGraphOptions;
}  // namespace tandem::engine

namespace tandem::cuda {

// A training step captured as a CUDA graph (engine::CudaGraphStep's body).
class GraphRunner {
 public:
  virtual ~GraphRunner() = default;
  virtual engine::StepOutputs run(const torch::Tensor& inputs, const torch::Tensor& targets) = 0;
  virtual bool captured() const = 0;
  virtual int64_t replays() const = 0;
  virtual int64_t eager_steps() const = 0;
};

struct Parts {
  // Whether the module was compiled with NCCL's headers (Note [nccl
  // headers] in src/cuda/nccl_group.cpp): without them it makes no NCCL
  // groups.
  bool nccl = false;
  // A ProcessGroupNCCL of `size` ranks over `store`; throws what c10d throws.
  c10::intrusive_ptr<c10d::Backend> (*nccl_group)(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                  int size, std::chrono::milliseconds timeout) = nullptr;
  // engine::CudaGraphStep's body on `device` (a CUDA device with an index).
  std::unique_ptr<GraphRunner> (*graph_step)(
      torch::Device device,
      std::function<engine::StepOutputs(const torch::Tensor& inputs, const torch::Tensor& targets)> step,
      const engine::CudaGraphOptions& options) = nullptr;
  // The name CUDA gives device `index` ("NVIDIA H100 80GB HBM3"); -1: the
  // current device.
  std::string (*device_name)(int index) = nullptr;
};

}  // namespace tandem::cuda

// The module's two exported symbols: its version of the struct, and the
// struct.
extern "C" __attribute__((visibility("default"))) int tandem_cuda_parts_version();
extern "C" __attribute__((visibility("default"))) const tandem::cuda::Parts* tandem_cuda_parts();
