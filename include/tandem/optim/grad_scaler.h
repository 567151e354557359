// tandem/optim/grad_scaler.h: dynamic loss scaling for fp16 training
// (PyTorch's torch.amp.GradScaler, same defaults and arithmetic).
//
//   optim::GradScaler scaler({}, group);      // group: may be null
//   scaler.scale(loss).backward();             // gradients are scale x true ones
//   scaler.step(optimizer);                    // unscale; step unless inf/NaN
//   scaler.update();                           // back off or grow the scale
//
// fp16's narrow range underflows small gradients; multiplying the loss by a
// large scale (65536 at first) keeps them representable. step() divides the
// gradients by the scale (libtorch's _amp_foreach_non_finite_check_and_unscale_,
// which also notes any inf or NaN) and skips the optimizer step if one was
// found. update(): after a skipped step the scale is multiplied by
// backoff_factor (0.5); after growth_interval (2000) clean steps in a row by
// growth_factor (2) (libtorch's _amp_update_scale_).
//
// Note [found-inf across ranks]: with a group, the found-inf flag is
// all-reduced (max) before the decision, so every rank skips or steps
// together and their scales stay equal, even where the ranks' gradients
// differ (no_sync, pipeline stages).
#pragma once

#include <cstdint>
#include <memory>

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include "tandem/dist/process_group.h"

namespace tandem::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class GradScaler {
 public:
  // Throws tandem::Error for a non-positive scale, growth <= 1, backoff
  // outside (0, 1) or an interval < 1.
  explicit GradScaler(GradScalerOptions options = {},
                      std::shared_ptr<dist::ProcessGroup> group = nullptr);

  // loss * scale (on loss's device; the scale follows it there).
  torch::Tensor scale(const torch::Tensor& loss);
  // Divides the optimizer's gradients by the scale in place and records
  // whether any is inf or NaN (over all ranks). Once per step; step() calls
  // it if it has not run (call it first to clip gradients, say).
  void unscale(torch::optim::Optimizer& optimizer);
  // Unscales if needed; runs optimizer.step() unless an inf/NaN was found.
  // Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Backs off after a skipped step, grows after growth_interval clean ones;
  // readies the next step.
  void update();

  double get_scale() const;
  int64_t growth_tracker() const;
  // For checkpoints: restore what get_scale() and growth_tracker() gave.
  void load_state(double scale, int64_t growth_tracker);

 private:
  void place(const torch::Device& device);

  GradScalerOptions options_;
  std::shared_ptr<dist::ProcessGroup> group_;
  torch::Tensor scale_;          // [1] float32
  torch::Tensor growth_tracker_;  // [1] int32
  torch::Tensor found_inf_;      // [1] float32: 1 when this step saw inf/NaN
  bool unscaled_ = false;
};

}  // namespace tandem::optim
