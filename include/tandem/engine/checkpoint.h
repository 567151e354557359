// tandem/engine/checkpoint.h: training state saved to and restored from disk.
//
// A checkpoint is DIR/checkpoint-<step>.pt, a libtorch archive holding the
// position in training (epoch, batch within the epoch, optimizer step), the
// running sums of the epoch in progress, the model's parameters and buffers,
// the optimizer state, the default CPU generator's state, and a fingerprint of
// the flags that must not change on resume. Files are written atomically; the
// newest `keep` are kept. See docs/CHECKPOINTS.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

namespace tandem::engine {

struct TrainPosition {
  int64_t epoch = 0;            // epoch in progress (0-based)
  int64_t batch_in_epoch = 0;   // batches of `epoch` already trained
  int64_t step = 0;             // optimizer steps taken in all
  double epoch_loss_sum = 0.0;  // sums over the batches of `epoch` so far
  int64_t epoch_correct = 0;
  int64_t epoch_seen = 0;
  double loss_scale = 0.0;           // --amp fp16: the gradient scaler's state (0: none)
  int64_t scale_growth_tracker = 0;
};

struct CheckpointOptions {
  std::string dir;
  int64_t keep = 2;  // newest checkpoints kept
};

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointOptions options);

  // Writes checkpoint-<position.step>.pt and prunes older ones. Returns its path.
  std::string save(const TrainPosition& position, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, const std::string& fingerprint) const;

  // The newest checkpoint in the directory, if any.
  std::optional<std::string> latest() const;

  // Restores model, optimizer and generator from `path`. Throws tandem::Error
  // naming the file if it is unreadable or was written with other flags.
  TrainPosition load(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const std::string& fingerprint) const;

 private:
  CheckpointOptions options_;
};

}  // namespace tandem::engine
