// The weights-comparison helpers of the CLI tests (same_weights.h).
#include "same_weights.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace tandem::testing {

// 20 steps on the synthetic data in `dir`: `flags` after the common ones
// (so they may override them), the weights exported to `dir`/`name`.
void train_and_export(const TempDir& dir, const std::string& flags, const std::string& name) {
  auto r = run_tandem("train --data idx:" + dir.path() + " --batch-size 32 --max-steps 20 --lr 0.05 "
                      "--progress off --export-weights " + dir.file(name) + " " + flags);
  ASSERT_EQ(r.exit_code, 0) << flags << ":\n" << r.output;
}

// Compares each of `others` (safetensors files in `dir`, described by
// `what`) with `reference`, per tensor; a `control` file, when given, must
// differ by more than 3 times the tolerance.
void expect_close_weights(const TempDir& dir, const std::string& reference,
                          const std::vector<std::pair<std::string, std::string>>& others,
                          double tolerance, const std::string& control) {
  std::string script =
      "import sys\n"
      "from safetensors.torch import load_file\n"
      "def worst(a, b):\n"
      "    assert a.keys() == b.keys()\n"
      "    return max(((a[k] - b[k]).norm() / (a[k].norm() + 1e-30)).item()\n"
      "               for k in a if a[k].is_floating_point())\n"
      "d, reference, tolerance, control = sys.argv[1:5]\n"
      "a = load_file(f'{d}/{reference}')\n"
      "tolerance = float(tolerance)\n"
      "for name, what in zip(sys.argv[5::2], sys.argv[6::2]):\n"
      "    difference = worst(a, load_file(f'{d}/{name}'))\n"
      "    print(what, ': worst relative difference', difference)\n"
      "    assert difference <= tolerance, f'{what}: relative difference {difference}'\n"
      "if control:\n"
      "    difference = worst(a, load_file(f'{d}/{control}'))\n"
      "    print('control: worst relative difference', difference)\n"
      "    assert difference > 3 * tolerance, f'control run: relative difference only {difference}'\n";
  std::ofstream(dir.file("compare.py")) << script;
  std::ostringstream bound;
  bound << tolerance;  // std::to_string would print 1e-12 as 0.000000
  std::string args = " " + dir.path() + " " + reference + " " + bound.str() + " '" + control + "'";
  for (const auto& [name, what] : others) args += " " + name + " '" + what + "'";
  auto r = run(std::string(TANDEM_PYTHON) + " " + dir.file("compare.py") + args);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s", r.output.c_str());  // the measured differences, for ctest -V
}

// Trains once per entry of `runs` (flags added to `model_flags`) and
// compares every run's weights with the first's; the control run (2 ranks,
// `control_flags`) must differ by more than 3 times the tolerance.
void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags,
                         double tolerance, const std::string& control_flags) {
  TempDir dir;
  write_synthetic_idx(dir.path(), 1024, 64);
  std::vector<std::pair<std::string, std::string>> others;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string name = "w" + std::to_string(i) + ".safetensors";
    train_and_export(dir, model_flags + " " + runs[i], name);
    if (i > 0) others.emplace_back(name, runs[i]);
  }
  if (!control_flags.empty()) {
    const bool ranks_given = control_flags.find("--nproc-per-node") != std::string::npos;
    train_and_export(dir, control_flags + (ranks_given ? "" : " --nproc-per-node 2"), "control.safetensors");
  }
  expect_close_weights(dir, "w0.safetensors", others, tolerance,
                       control_flags.empty() ? "" : "control.safetensors");
}

// Trains `first_half` (flags after `model`) for 10 steps with checkpoints in
// `dir`/`checkpoints` (that run's weights in first-half.safetensors), then
// resumes it to step 20 with `resume` instead, exporting `name`; returns the
// resumed run (its output with --progress lines).
CommandResult resume_after_ten_steps(const TempDir& dir, const std::string& model,
                                              const std::string& first_half, const std::string& resume,
                                              const std::string& checkpoints, const std::string& name) {
  train_and_export(dir, model + first_half + " --max-steps 10 --checkpoint-dir " + dir.file(checkpoints),
                   "first-half.safetensors");
  return run_tandem("train --data idx:" + dir.path() + " " + model + "--batch-size 32 --max-steps 20 "
                    "--lr 0.05 --progress lines --resume --checkpoint-dir " + dir.file(checkpoints) + " " +
                    resume + " --export-weights " + dir.file(name));
}

// `run` (with `model`) stopped at step 10, its checkpoints every 4 steps,
// then resumed each way of `hows`, ends where 20 uninterrupted steps of
// `run` do (float64: to rounding). `label` names `run` in the report.
void expect_resumes_as_uninterrupted(const TempDir& dir, const std::string& model, const std::string& run,
                                     const std::vector<std::string>& hows, const std::string& label,
                                     double tolerance) {
  train_and_export(dir, model + run, "whole.safetensors");
  std::vector<std::pair<std::string, std::string>> resumed;
  for (const auto& how : hows) {
    const std::string name = "resumed-" + std::to_string(resumed.size()) + ".safetensors";
    auto r = resume_after_ten_steps(dir, model, run + " --checkpoint-every 4", how,
                                    "ckpt-" + std::to_string(resumed.size()), name);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("step 10)"), std::string::npos) << r.output;
    resumed.emplace_back(name, label + ", then " + how);
  }
  expect_close_weights(dir, "whole.safetensors", resumed, tolerance, "first-half.safetensors");
}

std::string write_text(const TempDir& dir) {
  std::string text;
  const char* words[] = {"river", "stone", "lantern", "harbour", "meadow", "copper", "window", "signal"};
  for (int i = 0; text.size() < 5690; ++i) {
    text += std::string("The ") + words[i % 8] + " by the " + words[(i * 3 + 1) % 8] + " was " +
            (i % 3 ? "quiet" : "bright") + " at " + std::to_string(i % 24) + " o'clock. ";
  }
  const std::string path = dir.file("text.txt");
  std::ofstream(path) << text.substr(0, 5690);
  return path;
}


}  // namespace tandem::testing
