// CudaGraphStep in a build against a libtorch without CUDA (the CMake file
// picks this file or cuda_graph_cuda.cpp): every use is a clear error.
#include "tandem/engine/cuda_graph.h"

#include "tandem/util/check.h"

namespace tandem::engine {

bool cuda_graphs_built() { return false; }

struct CudaGraphStep::Impl {};

CudaGraphStep::CudaGraphStep(torch::Device device, StepFunction, CudaGraphOptions) {
  TANDEM_FAIL("--cuda-graph: this tandem was built against a libtorch without CUDA, so it cannot "
              "capture CUDA graphs (--device ", device.str(), ")");
}

CudaGraphStep::~CudaGraphStep() = default;

StepOutputs CudaGraphStep::run(const torch::Tensor&, const torch::Tensor&) {
  TANDEM_FAIL("CudaGraphStep::run: no CUDA in this build");
}

bool CudaGraphStep::captured() const { return false; }
int64_t CudaGraphStep::replays() const { return 0; }
int64_t CudaGraphStep::eager_steps() const { return 0; }

}  // namespace tandem::engine
