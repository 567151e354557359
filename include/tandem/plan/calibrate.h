// tandem/plan/calibrate.h: a device profile of this CPU machine made by
// measuring it (tandem plan --calibrate FILE), so that the planner's times
// can be checked against runs made here.
//
// Note [calibrated profile]: what a CPU training step costs is not its
// FLOPs alone. The calibration times real training steps of a registry
// model (a language model, or an image classifier: the planner's
// efficiency is the products' of the model it was fitted on, and a
// convolution's differs from a small matrix product's), forward,
// cross-entropy, backward, AdamW, one thread (a rank's share of this
// machine's cores) on every core at once (Note [calibrated under load] in
// calibrate.cpp), at several micro-batch sizes, and
// fits, by least squares, step = FLOPs / (peak x efficiency) + layers x
// layer_overhead: the slope gives the efficiency the matrix products reach
// at these shapes, the intercept what a layer costs besides its FLOPs
// (operator dispatch, the memory-bound element-wise work, the optimizer),
// which dominates small models and short sequences. A language model's
// norms and residual adds are timed apart at each size and taken out of
// the steps first (Note [replicated element-wise work] in norm_timing.h).
// The links are timed as a step uses them: all-reduces of 64 KiB to 16
// MiB between two ranks over loopback Gloo, between computations (Note
// [links timed between products] in calibrate.cpp), fitted as latency +
// bytes / bandwidth over the sizes a step sends (Gloo's cost of a call is
// not its cost for one float: 0.5 ms for 4 bytes here, in a quiet loop).
#pragma once

#include <array>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/dist/process_group.h"
#include "tandem/plan/device_profile.h"

namespace tandem::plan {

struct CalibrateOptions {
  std::string model = "llama-tiny";  // a registry language model, or image classifier
  int64_t seq_len = 64;
  int64_t image_size = 32;  // an image classifier's (3 channels, 10 classes)
  int64_t vocab = 256;
  std::vector<int64_t> micro_batches = {1, 2, 4, 8, 16};  // sequences, one timing each
  int steps = 9;  // timed steps a size (the median kept), in three rounds (Note [calibrated in rounds])
};

struct CalibrationPoint {
  int64_t micro_batch = 0;
  double flops = 0;    // the step's, forward and backward
  double seconds = 0;  // the median step
  double replicated = 0;  // of it, the layers' norms and residual adds (timed apart)
  double fitted = 0;   // the fit's step
};

struct Calibration {
  DeviceProfile profile;
  std::vector<CalibrationPoint> points;
  // Each all-reduce timed: its bytes, the ranks' mean seconds in a quiet
  // loop and between matrix products (Note [links timed between products]).
  std::vector<std::array<double, 3>> links;
};

using LinkTimes = std::vector<std::array<double, 3>>;

// Every rank of `group` calls it: all-reduces of 64 KiB to 16 MiB timed
// after a barrier and after matrix products, the ranks' mean of each.
LinkTimes time_allreduces(dist::ProcessGroup& group);

// The line a calibration fits to its (FLOPs, seconds) steps, {seconds a
// FLOP, seconds besides}: least squares; noise (or products faster than
// the timed peak, as a convolution's can be) may tilt it shallower than
// the peak allows, and then the slope is the peak's and the intercept the
// one that fits the steps at that slope; an intercept below 0 gives the
// fit through the origin (the overhead at least 0, the efficiency at
// most 1).
std::pair<double, double> fit_steps(const std::vector<std::pair<double, double>>& steps, double peak_flops);

// Measures this machine (about 10-30 s): the steps here, the links by
// `links` (time_allreduces over two processes: threads of one process
// wake each other faster than processes do). `say` reports each stage.
Calibration calibrate(const CalibrateOptions& options, const std::function<void(const std::string&)>& say,
                      const std::function<LinkTimes()>& links);

// The profile as a JSON file device_profile() reads back (Note [calibrated
// profile]); written atomically.
void write_profile(const DeviceProfile& profile, const std::string& path);

}  // namespace tandem::plan
