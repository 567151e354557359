// tandem train --config FILE.toml (Note [job files] in src/cli/config_file.h):
// a job file of the flags by section reproduces the command line's run
// exactly, over two ranks too; the configuration a run writes repeats it;
// the command line replaces the file's flags; what the file holds that is
// not a flag of its section is refused, naming the file and the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

// The metrics' lines without their timings (which no two runs share).
std::string figures(const std::string& path) {
  std::string out;
  std::istringstream in(testing::read_text(path));
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    for (const char* key : {"epoch_seconds", "images_per_second", "tokens_per_second", "mfu"}) j.erase(key);
    out += j.dump() + "\n";
  }
  return out;
}

TEST(ConfigCliTest, AJobFileReproducesTheCommandLinesRunExactly) {
  TempDir dir;
  const auto text = testing::write_text(dir);
  const std::string flags = " --model gpt2-tiny --dtype float64 --data text:" + text +
                            " --seq-len 16 --batch-size 8 --epochs 2 --max-steps 6 --lr 3e-3 --clip-grad-norm 0.5 "
                            "--seed 7 --nproc-per-node 2 --mesh dp=2 --progress off";
  auto r = run_tandem("train" + flags + " --metrics-out " + dir.file("cli.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ofstream(dir.file("job.toml")) << "# the same job\n[data]\ndata = \"text:" << text << "\"\nseq_len = 16\n\n"
                                      << "[model]\nmodel = \"gpt2-tiny\"\ndtype = \"float64\"\n\n"
                                      << "[optimisation]\nbatch-size = 8\nepochs = 2\nmax_steps = 6\nlr = 3e-3\n"
                                      << "clip_grad_norm = 0.5\n\n[distributed]\nnproc_per_node = 2\n"
                                      << "mesh = \"dp=2\"\n\n[run]\nseed = 7\nprogress = \"off\"\n"
                                      << "metrics_out = \"" << dir.file("toml.jsonl") << "\"\n";
  r = run_tandem("train --config " + dir.file("job.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto cli = figures(dir.file("cli.jsonl"));
  EXPECT_EQ(figures(dir.file("toml.jsonl")), cli);
  EXPECT_NE(cli.find("\"step\":6"), std::string::npos) << cli;

  // The configuration the run wrote repeats it (its metrics-out moved).
  auto written = testing::read_text(dir.file("toml.config.toml"));
  EXPECT_NE(written.find("[optimisation]"), std::string::npos) << written;
  const auto at = written.find(dir.file("toml.jsonl"));
  ASSERT_NE(at, std::string::npos) << written;
  written.replace(at, dir.file("toml.jsonl").size(), dir.file("again.jsonl"));
  std::ofstream(dir.file("again.toml")) << written;
  r = run_tandem("train --config " + dir.file("again.toml"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(figures(dir.file("again.jsonl")), cli);

  // The command line replaces the file's flag: another lr, other figures.
  r = run_tandem("train --config " + dir.file("job.toml") + " --lr 1e-3 --metrics-out " + dir.file("lr.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(figures(dir.file("lr.jsonl")), cli);
  // 1e-3 as scheduled at step 6: a third of the file's 3e-3 there.
  const double lr = testing::last_metrics(dir.file("lr.jsonl"))["lr"].get<double>();
  const double file_lr = testing::last_metrics(dir.file("cli.jsonl"))["lr"].get<double>();
  EXPECT_NEAR(lr * 3, file_lr, 1e-12);

  // A run refused (its --checkpoint-dir holds an earlier run's) leaves the
  // earlier run's configuration there.
  r = run_tandem("train --config " + dir.file("job.toml") + " --checkpoint-dir " + dir.file("ck"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto kept = testing::read_text(dir.file("ck/config.toml"));
  EXPECT_NE(kept.find("seed = '7'"), std::string::npos) << kept;
  r = run_tandem("train --config " + dir.file("job.toml") + " --checkpoint-dir " + dir.file("ck") + " --seed 8");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_EQ(testing::read_text(dir.file("ck/config.toml")), kept);
}

TEST(ConfigCliTest, WhatIsNotAFlagOfItsSectionIsRefused) {
  TempDir dir;
  auto refused = [&](const std::string& toml, const std::string& message) {
    std::ofstream(dir.file("bad.toml")) << toml;
    return testing::tandem_fails("train --config " + dir.file("bad.toml"), 2, message);
  };
  EXPECT_TRUE(refused("[data]\nseq_lenn = 16\n", "[data] seq_lenn: unknown flag"));
  EXPECT_TRUE(refused("[model]\nlr = 0.1\n", "[model] lr: --lr belongs in [optimisation]"));
  EXPECT_TRUE(refused("lr = 0.1\n", "\"lr\" is not a section"));
  EXPECT_TRUE(refused("[optimisation]\nnesterov = 1\n", "[optimisation] nesterov: a switch takes true or false"));
  EXPECT_TRUE(refused("[run]\nconfig = \"other.toml\"\n", "a job file does not name another"));
  EXPECT_TRUE(refused("[data\nseq_len = 16\n", "bad.toml: not TOML (line 1"));
  EXPECT_TRUE(refused("[data]\nseq_len = 16\nseq-len = 32\n", "--seq-len is given twice"));
  EXPECT_TRUE(refused("[optimisation]\nlr = -1.0\n", "bad.toml: [optimisation] lr: --lr"));
  EXPECT_TRUE(refused("[run]\nseed = 1.5\n", "bad.toml: [run] seed: --seed"));
  EXPECT_TRUE(testing::tandem_fails("train --config " + dir.file("absent.toml"), 2, "absent.toml"));
}

}  // namespace
}  // namespace tandem
