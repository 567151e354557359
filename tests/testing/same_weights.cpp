// The weights-comparison helpers of the equality tests (same_weights.h).
#include "same_weights.h"

#include <cstdio>
#include <fstream>

#include "train_threads.h"

namespace tandem::testing {

namespace {

// The output of a run, and whether it ended well, however it ran.
CommandResult train(const std::string& flags, const RunStyle& style) {
  if (!style.threads) return run_tandem("train " + flags);
  const auto job = train_in_threads(flags);
  return {job.ok() ? 0 : 1, job.report()};
}

std::string common_flags(const TempDir& dir, int steps) {
  return "--data idx:" + dir.path() + " --batch-size 32 --max-steps " + std::to_string(steps) +
         " --lr 0.05 --progress off ";
}

}  // namespace

void train_and_export(const TempDir& dir, const std::string& flags, const std::string& name,
                      const RunStyle& style) {
  auto r = train(common_flags(dir, style.steps) + "--export-weights " + dir.file(name) + " " + flags, style);
  ASSERT_EQ(r.exit_code, 0) << flags << ":\n" << r.output;
}

void expect_close_weights(const TempDir& dir, const std::string& reference,
                          const std::vector<std::pair<std::string, std::string>>& others,
                          double tolerance, const std::string& control) {
  const auto a = read_weights(dir.file(reference));
  for (const auto& [name, what] : others) {
    const double d = worst_relative_difference(a, read_weights(dir.file(name)));
    std::printf("%s: worst relative difference %.3g\n", what.c_str(), d);  // for ctest -V
    EXPECT_LE(d, tolerance) << what << ": relative difference " << d;
  }
  if (control.empty()) return;
  const double d = worst_relative_difference(a, read_weights(dir.file(control)));
  std::printf("control: worst relative difference %.3g\n", d);
  EXPECT_GT(d, 3 * tolerance) << "control run: relative difference only " << d << ", so the bound cannot fail";
}

void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags,
                         double tolerance, const std::string& control_flags, const RunStyle& style) {
  TempDir dir;
  write_synthetic_idx(dir.path(), 1024, 64);
  std::vector<std::pair<std::string, std::string>> others;
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string name = "w" + std::to_string(i) + ".safetensors";
    train_and_export(dir, model_flags + " " + runs[i], name, style);
    if (::testing::Test::HasFatalFailure()) return;
    if (i > 0) others.emplace_back(name, runs[i]);
  }
  if (!control_flags.empty()) {
    const bool ranks_given = control_flags.find("--nproc-per-node") != std::string::npos;
    train_and_export(dir, control_flags + (ranks_given ? "" : " --nproc-per-node 2"), "control.safetensors",
                     style);
    if (::testing::Test::HasFatalFailure()) return;
  }
  expect_close_weights(dir, "w0.safetensors", others, tolerance,
                       control_flags.empty() ? "" : "control.safetensors");
}

CommandResult resume_halfway(const TempDir& dir, const std::string& model, const std::string& first_half,
                             const std::string& resume, const std::string& checkpoints, const std::string& name,
                             const RunStyle& style) {
  RunStyle half = style;
  half.steps = style.steps / 2;
  train_and_export(dir, model + first_half + " --checkpoint-dir " + dir.file(checkpoints) + " " + style.checkpoints,
                   "first-half.safetensors", half);
  return train("--data idx:" + dir.path() + " " + model + "--batch-size 32 --max-steps " +
                   std::to_string(style.steps) + " --lr 0.05 --progress lines --resume --checkpoint-dir " +
                   dir.file(checkpoints) + " " + style.checkpoints + " " + resume + " --export-weights " + dir.file(name),
               style);
}

void expect_resumes_as_uninterrupted(const TempDir& dir, const std::string& model, const std::string& run,
                                     const std::vector<std::string>& hows, const std::string& label,
                                     double tolerance, const RunStyle& style) {
  train_and_export(dir, model + run, "whole.safetensors", style);
  const std::string every = style.steps >= 16 ? " --checkpoint-every 4" : " --checkpoint-every 2";
  const std::string halfway = "step " + std::to_string(style.steps / 2) + ")";
  std::vector<std::pair<std::string, std::string>> resumed;
  for (const auto& how : hows) {
    const std::string name = "resumed-" + std::to_string(resumed.size()) + ".safetensors";
    auto r = resume_halfway(dir, model, run + every, how, "ckpt-" + std::to_string(resumed.size()), name, style);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(halfway), std::string::npos) << r.output;
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
