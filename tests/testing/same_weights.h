// tests/testing/same_weights.h: train with tandem's CLI, or with its ranks as
// threads (train_threads.h), and compare the exported weights per tensor,
// with a control run that must fail the bound. The equality tests of every
// strategy and composition are built on these.
//
// expect_same_weights trains 20 steps (RunStyle::steps) once per entry of
// `runs` (flags added to `model_flags`: 1, 2 and 4 ranks, say), all from the same seed and
// global batch, and compares each run's exported weights, per tensor
// (|a - b| / |a|, 2-norms), with the first run's. The ranks sum gradients and
// statistics in a different order than one process does, so the runs
// differ by rounding, which training amplifies. In float64 they agree to
// about 1e-15, which pins the arithmetic down exactly: a wrong gradient
// scale, a missing all-reduce or per-rank BatchNorm statistics would show up
// as 1e-3 or more (the control run: 0.07). In float32 the agreement depends
// on the machine: usually 1e-7 to 1e-6 after 20 steps, but rounding can
// also change a discrete decision (a ReLU input within rounding of zero
// taking the other sign is the likely one), which training then grows: on an
// AVX-512 machine, convnet on 2 ranks jumped from 5e-7 to 1.2e-4 at step 6
// and ended at 1.3e-3. So float32 runs are held to 1e-2, with the control
// run well outside it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "testing.h"

namespace tandem::testing {

// How the runs of a comparison are made.
struct RunStyle {
  // The ranks as threads of this process (train_threads.h), or as the
  // processes of `tandem train --nproc-per-node N`.
  bool threads = false;
  // Optimizer steps of a whole run; a resumed run stops at half of them.
  int steps = 20;
  // Flags of the runs that write or read checkpoints only (e.g.
  // "--checkpoint-format file", which needs --checkpoint-dir).
  const char* checkpoints = "";
};
inline constexpr RunStyle kInThreads{true, 20};

// `style.steps` steps on the synthetic data in `dir`: `flags` after the
// common ones (so they may override them), the weights exported to
// `dir`/`name`.
void train_and_export(const TempDir& dir, const std::string& flags, const std::string& name,
                      const RunStyle& style = {});

// Compares each of `others` (safetensors files in `dir`, described by
// `what`) with `reference`, per tensor, printing the differences; a
// `control` file, when given, must differ by more than 3 times the
// tolerance.
void expect_close_weights(const TempDir& dir, const std::string& reference,
                          const std::vector<std::pair<std::string, std::string>>& others,
                          double tolerance, const std::string& control = "");

// Trains once per entry of `runs` (flags added to `model_flags`) and
// compares every run's weights with the first's; the control run
// (`control_flags`, on 2 ranks unless they name --nproc-per-node) must
// differ by more than 3 times the tolerance.
void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags,
                         double tolerance, const std::string& control_flags = "", const RunStyle& style = {});

// Trains `first_half` (flags after `model`) for half of `style.steps`
// with checkpoints in `dir`/`checkpoints` (that run's weights in
// first-half.safetensors), then resumes it to the end with `resume`
// instead, exporting `name`; returns the resumed run (its output with
// --progress lines).
CommandResult resume_halfway(const TempDir& dir, const std::string& model, const std::string& first_half,
                             const std::string& resume, const std::string& checkpoints, const std::string& name,
                             const RunStyle& style = {});

// `run` (with `model`) stopped halfway, its checkpoints every 4 steps (2
// for runs of fewer than 16), then resumed each way of `hows`, ends where
// the uninterrupted `run` does (float64: to rounding, `tolerance`).
// `label` names `run` in the report.
void expect_resumes_as_uninterrupted(const TempDir& dir, const std::string& model, const std::string& run,
                                     const std::vector<std::string>& hows, const std::string& label,
                                     double tolerance = 1e-12, const RunStyle& style = {});

// 5,690 bytes of prose that repeat with variations, as text.txt in `dir`
// (returned): a training part of 5,121 bytes, 320 windows of 16 (+ 1), 10
// steps of 32 an epoch, which 2 and 4 ranks divide evenly (DistributedSampler
// would pad an uneven epoch with repeated windows, as PyTorch's does); a
// held-out tail of 569. The language models' float64 comparisons train on it.
std::string write_text(const TempDir& dir);

}  // namespace tandem::testing
