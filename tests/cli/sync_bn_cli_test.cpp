// World-size invariance: the same seed and global batch on 1, 2 and 4 Gloo
// ranks give the same weights, with --sync-bn for a BatchNorm model, and for
// a model without BatchNorm; and so does each rank's batch passed in chunks
// (--grad-accum, DDP's no_sync), with and without gradient clipping.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::run_tandem;
using testing::TempDir;

// expect_same_weights trains 20 steps once per entry of `runs` (flags added
// to `model_flags`: 1, 2 and 4 ranks, say), all from the same seed and
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
// run well outside it. The control run (2 ranks, `control_flags`) must
// differ by more than 3 times the tolerance.
void expect_same_weights(const std::vector<std::string>& runs, const std::string& model_flags,
                         double tolerance, const std::string& control_flags = "") {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 1024, 64);
  for (size_t i = 0; i < runs.size(); ++i) {
    auto r = run_tandem("train " + runs[i] + " --data idx:" + dir.path() + " " + model_flags +
                        " --batch-size 32 --max-steps 20 --lr 0.05 --progress off --export-weights " +
                        dir.file("w" + std::to_string(i) + ".safetensors"));
    ASSERT_EQ(r.exit_code, 0) << runs[i] << ":\n" << r.output;
  }
  if (!control_flags.empty()) {
    auto r = run_tandem("train --nproc-per-node 2 --data idx:" + dir.path() + " " + control_flags +
                        " --batch-size 32 --max-steps 20 --lr 0.05 --progress off --export-weights " +
                        dir.file("control.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
  }
  std::string script =
      "import sys\n"
      "from safetensors.torch import load_file\n"
      "a = load_file(sys.argv[1] + '/w0.safetensors')\n"
      "tolerance = float(sys.argv[2])\n"
      "for n, run in enumerate(sys.argv[3:], 1):\n"
      "    b = load_file(sys.argv[1] + f'/w{n}.safetensors')\n"
      "    assert a.keys() == b.keys()\n"
      "    worst = max(((a[k] - b[k]).norm() / (a[k].norm() + 1e-30)).item()\n"
      "                for k in a if a[k].is_floating_point())\n"
      "    print(run, ': worst relative difference', worst)\n"
      "    assert worst <= tolerance, f'{run}: relative difference {worst}'\n"
      "import os\n"
      "if os.path.exists(sys.argv[1] + '/control.safetensors'):\n"
      "    c = load_file(sys.argv[1] + '/control.safetensors')\n"
      "    worst = max(((a[k] - c[k]).norm() / (a[k].norm() + 1e-30)).item()\n"
      "                for k in a if a[k].is_floating_point())\n"
      "    print('control: worst relative difference', worst)\n"
      "    assert worst > 3 * tolerance, f'control run: relative difference only {worst}'\n";
  std::ofstream(dir.file("compare.py")) << script;
  std::ostringstream bound;
  bound << tolerance;  // std::to_string would print 1e-12 as 0.000000
  std::string names;  // every run after the first, quoted, for the messages
  for (size_t i = 1; i < runs.size(); ++i) names += " '" + runs[i] + "'";
  auto r = run(std::string(TANDEM_PYTHON) + " " + dir.file("compare.py") + " " + dir.path() + " " +
               bound.str() + names);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s", r.output.c_str());  // the measured differences, for ctest -V
}

void expect_world_size_invariance(const std::string& model_flags, double tolerance,
                                  const std::string& control_flags = "") {
  expect_same_weights({"--nproc-per-node 1", "--nproc-per-node 2", "--nproc-per-node 4"}, model_flags,
                      tolerance, control_flags);
}

TEST(SyncBnCliTest, OneTwoAndFourRanksGiveTheSameWeights) {
  // Control: without --sync-bn each rank normalises by its own part of the batch.
  expect_world_size_invariance("--model convnet --sync-bn", 1e-2, "--model convnet");
}

TEST(SyncBnCliTest, AModelWithoutBatchNormIsInvariantToo) {
  expect_world_size_invariance("--model mlp", 1e-2);
}

TEST(SyncBnCliTest, InFloat64TheRanksAgreeToRounding) {
  // The bound (1e-5) holds here with seven orders of magnitude to spare.
  expect_world_size_invariance("--model convnet --sync-bn --dtype float64", 1e-12, "--model convnet --dtype float64");
  expect_world_size_invariance("--model mlp --dtype float64", 1e-12);
}

// --grad-accum over ranks: DDP (the first chunks' backwards under no_sync,
// the last one's all-reducing) and seed 004's all-reduce after backward give
// one process's weights, uneven chunks included; so does --clip-grad-norm,
// which every rank applies to the same averaged gradients (the control: the
// same runs without it).
TEST(GradAccumCliTest, ChunksOnSeveralRanksGiveOneProcesssWeights) {
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2 --grad-accum 2",
                       "--nproc-per-node 2 --grad-accum 3 --strategy allreduce",
                       "--nproc-per-node 4 --grad-accum 8"},
                      "--model mlp --dtype float64", 1e-12);
  expect_same_weights({"--nproc-per-node 0", "--nproc-per-node 2", "--nproc-per-node 2 --grad-accum 4"},
                      "--model mlp --dtype float64 --clip-grad-norm 0.02", 1e-12,
                      "--model mlp --dtype float64");
}

}  // namespace
}  // namespace tandem
