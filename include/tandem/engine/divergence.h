// tandem/engine/divergence.h: telling a diverged run, and why it diverged.
//
// Note [diverged]: a loss that turns NaN or infinite never comes back (the
// weights are NaN from then on), and going on would spend the rest of the
// run, and write checkpoints and exports of such weights, for nothing.
// Nor is a run whose weights overflow while its training loss is still
// finite a result: its evaluation gives NaN (BatchNorm's running variance
// overflows first). So the trainer counts, at every sync of its sums (every
// 10 steps, before every checkpoint and at an epoch's end: the sums are
// all-reduced there anyway), the tensors of its weights and buffers that
// hold a value that is not finite, along with the loss sum, and checks the
// evaluation's loss; any of them not finite ends the run on every rank at
// the same step, before a checkpoint, a metrics line or an export of it is
// written. Checking every step would cost a device sync per step. With
// --amp fp16 an overflow in the backward of the scaled loss is the
// scaler's to handle (it skips that step).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

namespace tandem::engine {

// What the message's advice is drawn from: the run's settings and what it
// saw. Pure data, so that the advice is testable without training.
struct DivergenceFacts {
  double lr = 0.0;            // the learning rate when it was seen
  double peak_lr = 0.0;       // --lr
  double weight_decay = 0.0;  // SGD's L2 weight decay
  double momentum = 0.0;
  bool nesterov = false;
  // The weights the run started from: the largest magnitude among them,
  // the tensor that held it, and where they came from ("--init-weights F",
  // "the checkpoint F"; empty for a random initialisation).
  double start_largest = 0.0;
  std::string start_tensor;
  std::string start_source;
  // The mean training loss at the run's first sync and at its last finite
  // one (NaN when there was none).
  double first_loss = 0.0 / 0.0;
  double last_loss = 0.0 / 0.0;
};

// Weights larger than this at the start are "already huge": trained
// networks' weights stay within a few hundred.
inline constexpr double kHugeWeight = 1e4;

// A weight decay above this is out of the ordinary for SGD (1e-4 to 5e-3
// are usual), and named as the cause when it alone makes weights grow.
inline constexpr double kLargeWeightDecay = 0.05;

// The advice that ends a divergence message: what the run shows to be the
// cause (weights that were already huge, a weight decay that alone makes
// the weights grow, else the learning rate) and what to change.
std::string divergence_advice(const DivergenceFacts& facts);

// The largest magnitude among `tensors` (floating point ones; a NaN counts
// as the largest) and the name of the tensor holding it.
std::pair<double, std::string> largest_magnitude(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

// How many of `tensors` (floating point ones) hold a value that is not
// finite, as a float64 scalar on `device`, to be all-reduced with the
// loss sums: one reduction pass, no device sync.
torch::Tensor count_non_finite(const std::vector<torch::Tensor>& tensors, const torch::Device& device);

// The name of the first of `tensors` that holds a value that is not
// finite, or "".
std::string first_non_finite(const std::vector<std::pair<std::string, torch::Tensor>>& tensors);

}  // namespace tandem::engine
