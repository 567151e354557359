// CudaGraphStep on a CUDA build of libtorch (the CMake file picks this file
// or cuda_graph_none.cpp).
#include "tandem/engine/cuda_graph.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/util/check.h"

namespace tandem::engine {

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// Note [detached step outputs]: the step's loss and logits come back
// detached. Their autograd graph holds each parameter's AccumulateGrad node,
// which remembers the stream it was made on; kept alive, the next eager step
// on another stream (an epoch's short last batch on the current stream, after
// a capture on the side stream) reuses those nodes, and autograd warns of the
// mismatch ("The AccumulateGrad node's stream does not match ..."), as it
// would for a Python loss kept across iterations. The values are the same
// tensors' memory, so a replay still refreshes them.
StepOutputs detached(StepOutputs out) {
  out.logits = out.logits.detach();
  out.loss = out.loss.detach();
  return out;
}

// `waiter` runs what follows only after what `signaller` has queued so far.
void wait_for(const c10::cuda::CUDAStream& waiter, const c10::cuda::CUDAStream& signaller) {
  at::cuda::CUDAEvent event;
  event.record(signaller);
  event.block(waiter);
}

}  // namespace

bool cuda_graphs_built() { return true; }

struct CudaGraphStep::Impl {
  torch::Device device;
  StepFunction step;
  CudaGraphOptions options;
  c10::cuda::CUDAStream side;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  torch::Tensor static_inputs, static_targets;
  StepOutputs static_outputs;
  std::vector<int64_t> first_sizes;  // the first warm-up batch's: the shape to capture
  int64_t eager = 0, replays = 0;

  Impl(torch::Device d, StepFunction s, CudaGraphOptions o)
      : device(d), step(std::move(s)), options(o), side(c10::cuda::getStreamFromPool(false, d.index())) {}

  bool fits(const torch::Tensor& x, const torch::Tensor& y) const {
    return x.sizes() == static_inputs.sizes() && x.scalar_type() == static_inputs.scalar_type() &&
           y.sizes() == static_targets.sizes() && y.scalar_type() == static_targets.scalar_type();
  }

  // Note [streams of a graphed step]: a warm-up step on the side stream.
  StepOutputs warm_up(const torch::Tensor& x, const torch::Tensor& y) {
    if (first_sizes.empty()) first_sizes = x.sizes().vec();
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    wait_for(side, current);
    StepOutputs out;
    {
      c10::cuda::CUDAStreamGuard guard(side);
      out = detached(step(x, y));
    }
    wait_for(current, side);
    // Made on one stream, used on the other: the caching allocator must not
    // hand their memory out again before both are done with it.
    x.record_stream(side);
    y.record_stream(side);
    out.logits.record_stream(current);
    out.loss.record_stream(current);
    ++eager;
    return out;
  }

  StepOutputs capture(const torch::Tensor& x, const torch::Tensor& y) {
    auto current = c10::cuda::getCurrentCUDAStream(device.index());
    static_inputs = torch::empty_like(x).copy_(x);  // keeps x's memory format
    static_targets = torch::empty_like(y).copy_(y);
    // As torch.cuda.graph does: nothing of the warm-up still running while
    // the capture begins.
    c10::cuda::device_synchronize();
    if (options.before_capture) options.before_capture();
    wait_for(side, current);
    graph = std::make_unique<at::cuda::CUDAGraph>();
    {
      c10::cuda::CUDAStreamGuard guard(side);
      // Casts autocast caches inside the captured region would be stale on
      // replay (PyTorch's advice: autocast(cache_enabled=False) with graphs).
      bool cache = at::autocast::is_autocast_cache_enabled();
      at::autocast::set_autocast_cache_enabled(false);
      bool begun = false;
      try {
        // Thread-local capture mode: the loader's worker threads pin memory
        // (cudaHostAlloc, event queries) while the step is captured, which
        // the global mode forbids to every thread (torch.cuda.graph's
        // capture_error_mode="thread_local").
        graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
        begun = true;
        static_outputs = detached(step(static_inputs, static_targets));
        graph->capture_end();
        at::autocast::set_autocast_cache_enabled(cache);
      } catch (const std::exception& e) {
        if (begun) {
          try {
            graph->capture_end();
          } catch (const std::exception&) {
          }
        }
        graph.reset();
        at::autocast::set_autocast_cache_enabled(cache);
        TANDEM_FAIL("--cuda-graph: the training step could not be captured as a CUDA graph: ",
                    first_line(e.what()),
                    " (a captured step may not wait for the GPU on the host, e.g. .item(); run "
                    "without --cuda-graph)");
      }
    }
    wait_for(current, side);
    // Capture recorded the step without running it: run it now.
    graph->replay();
    ++replays;
    return static_outputs;
  }
};

CudaGraphStep::CudaGraphStep(torch::Device device, StepFunction step, CudaGraphOptions options) {
  TANDEM_CHECK(device.is_cuda(), "--cuda-graph needs --device cuda (a CUDA graph replays GPU "
               "kernels), got --device ", device.str());
  TANDEM_CHECK(options.warmup_steps >= 1, "CudaGraphStep: warmup_steps must be at least 1 (the "
               "step's state is made eagerly), got ", options.warmup_steps);
  if (!device.has_index()) device = torch::Device(torch::kCUDA, c10::cuda::current_device());
  impl_ = std::make_unique<Impl>(device, std::move(step), options);
}

CudaGraphStep::~CudaGraphStep() = default;

StepOutputs CudaGraphStep::run(const torch::Tensor& inputs, const torch::Tensor& targets) {
  auto& s = *impl_;
  TANDEM_CHECK(inputs.device() == s.device && targets.device() == s.device,
               "CudaGraphStep::run: inputs on ", inputs.device().str(), " and targets on ",
               targets.device().str(), ", expected both on ", s.device.str());
  c10::cuda::CUDAGuard device_guard(s.device.index());
  if (s.graph) {
    if (!s.fits(inputs, targets)) {  // a short last batch: eagerly, on the current stream
      ++s.eager;
      return detached(s.step(inputs, targets));
    }
    s.static_inputs.copy_(inputs, /*non_blocking=*/true);
    s.static_targets.copy_(targets, /*non_blocking=*/true);
    s.graph->replay();
    ++s.replays;
    return s.static_outputs;
  }
  if (s.eager < s.options.warmup_steps) return s.warm_up(inputs, targets);
  // Capture the common shape (the first batch's), not an epoch's short last
  // batch that happens to come right after the warm-up.
  if (inputs.sizes() != c10::IntArrayRef(s.first_sizes)) return s.warm_up(inputs, targets);
  return s.capture(inputs, targets);
}

bool CudaGraphStep::captured() const { return impl_->graph != nullptr; }
int64_t CudaGraphStep::replays() const { return impl_->replays; }
int64_t CudaGraphStep::eager_steps() const { return impl_->eager; }

}  // namespace tandem::engine
