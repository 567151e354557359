// CudaGraphStep: the checks, then the CUDA module's body (Note [CUDA as a
// module] in tandem/util/cuda_module.h; the body is src/cuda/graph_step.cpp).
#include "tandem/engine/cuda_graph.h"

#include "tandem/cuda/parts.h"
#include "tandem/util/check.h"

namespace tandem::engine {

bool cuda_graphs_built() {
#ifdef TANDEM_CUDA_MODULE_BUILT
  return true;
#else
  return false;
#endif
}

struct CudaGraphStep::Impl {
  std::unique_ptr<cuda::GraphRunner> runner;
};

CudaGraphStep::CudaGraphStep(torch::Device device, StepFunction step, CudaGraphOptions options)
    : impl_(std::make_unique<Impl>()) {
  TANDEM_CHECK(cuda_graphs_built(), "--cuda-graph: this tandem was built against a libtorch without CUDA, "
               "so it cannot capture CUDA graphs (--device ", device.str(), ")");
  TANDEM_CHECK(device.is_cuda(), "--cuda-graph needs --device cuda (a CUDA graph replays GPU "
               "kernels), got --device ", device.str());
  TANDEM_CHECK(options.warmup_steps >= 1, "CudaGraphStep: warmup_steps must be at least 1 (the "
               "step's state is made eagerly), got ", options.warmup_steps);
  const auto* parts = cuda::parts();
  TANDEM_CHECK(parts != nullptr, "--cuda-graph: tandem's CUDA module is not loaded: ", cuda::load_error());
  impl_->runner = parts->graph_step(device, std::move(step), options);
}

CudaGraphStep::~CudaGraphStep() = default;

StepOutputs CudaGraphStep::run(const torch::Tensor& inputs, const torch::Tensor& targets) {
  return impl_->runner->run(inputs, targets);
}

bool CudaGraphStep::captured() const { return impl_->runner->captured(); }
int64_t CudaGraphStep::replays() const { return impl_->runner->replays(); }
int64_t CudaGraphStep::eager_steps() const { return impl_->runner->eager_steps(); }

}  // namespace tandem::engine
