// The replicated element-wise work of a layer, timed (norm_timing.h).
#include "norm_timing.h"

#include <chrono>

#include <torch/torch.h>

#include "one_thread.h"
#include "tandem/models/llama.h"
#include "tandem/util/stats.h"

namespace tandem::plan::internal {
namespace {

// A layer's replicated work: h + norm(h), twice, forward and backward,
// with the model's own norm module.
template <class Norm>
std::vector<double> layer_times(Norm& first, Norm& second, int64_t rows, int64_t hidden, int steps) {
  std::vector<double> times;
  auto x = torch::randn({rows, hidden}, torch::requires_grad());
  for (int i = 0; i < steps + 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    auto h = x + first->forward(x);
    h = h + second->forward(h);
    h.sum().backward();
    if (i >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return times;
}

}  // namespace

std::vector<DeviceProfile::NormTiming> time_norms(int64_t hidden, const std::vector<int64_t>& tokens, int64_t cores,
                                                  int steps) {
  const OneThread one_thread;
  std::vector<models::RmsNorm> rms;
  std::vector<torch::nn::LayerNorm> layer;
  for (int64_t c = 0; c < 2 * cores; ++c) {
    rms.emplace_back(hidden, 1e-5);
    layer.emplace_back(torch::nn::LayerNormOptions({hidden}));
  }
  std::vector<DeviceProfile::NormTiming> out;
  for (const int64_t rows : tokens) {
    DeviceProfile::NormTiming t;
    t.elements = double(rows * hidden);
    t.rms = median(on_every_core(cores, [&](int64_t c) {
      return layer_times(rms[static_cast<size_t>(2 * c)], rms[static_cast<size_t>(2 * c + 1)], rows, hidden, steps);
    }));
    t.layer = median(on_every_core(cores, [&](int64_t c) {
      return layer_times(layer[static_cast<size_t>(2 * c)], layer[static_cast<size_t>(2 * c + 1)], rows, hidden,
                         steps);
    }));
    out.push_back(t);
  }
  return out;
}

}  // namespace tandem::plan::internal
