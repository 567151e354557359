// engine::CudaGraphStep's body in the CUDA module (src/engine/cuda_graph.cpp
// holds the class and calls this through tandem/cuda/parts.h).
#include "module.h"

#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "tandem/util/check.h"

namespace tandem::cuda {

using engine::CudaGraphOptions;
using engine::StepFunction;
using engine::StepOutputs;

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

struct GraphStep final : GraphRunner {
  torch::Device device;
  StepFunction step;
  CudaGraphOptions options;
  c10::cuda::CUDAStream side;
  std::unique_ptr<at::cuda::CUDAGraph> graph;
  torch::Tensor static_inputs, static_targets;
  StepOutputs static_outputs;
  std::vector<int64_t> first_sizes;  // the first warm-up batch's: the shape to capture
  int64_t eager = 0, replay_count = 0;

  GraphStep(torch::Device d, StepFunction s, CudaGraphOptions o)
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
    ++replay_count;
    return static_outputs;
  }

  StepOutputs run(const torch::Tensor& inputs, const torch::Tensor& targets) override {
    TANDEM_CHECK(inputs.device() == device && targets.device() == device, "CudaGraphStep::run: inputs on ",
                 inputs.device().str(), " and targets on ", targets.device().str(), ", expected both on ",
                 device.str());
    c10::cuda::CUDAGuard device_guard(device.index());
    if (graph) {
      if (!fits(inputs, targets)) {  // a short last batch: eagerly, on the current stream
        ++eager;
        return detached(step(inputs, targets));
      }
      static_inputs.copy_(inputs, /*non_blocking=*/true);
      static_targets.copy_(targets, /*non_blocking=*/true);
      graph->replay();
      ++replay_count;
      return static_outputs;
    }
    if (eager < options.warmup_steps) return warm_up(inputs, targets);
    // Capture the common shape (the first batch's), not an epoch's short last
    // batch that happens to come right after the warm-up.
    if (inputs.sizes() != c10::IntArrayRef(first_sizes)) return warm_up(inputs, targets);
    return capture(inputs, targets);
  }

  bool captured() const override { return graph != nullptr; }
  int64_t replays() const override { return replay_count; }
  int64_t eager_steps() const override { return eager; }
};

}  // namespace

std::unique_ptr<GraphRunner> graph_step(torch::Device device, StepFunction step, const CudaGraphOptions& options) {
  if (!device.has_index()) device = torch::Device(torch::kCUDA, c10::cuda::current_device());
  return std::make_unique<GraphStep>(device, std::move(step), options);
}

}  // namespace tandem::cuda
