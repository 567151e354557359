// World-size invariance with --sync-bn: the same seed and global batch on 1,
// 2 and 4 Gloo ranks give the same weights, up to float summation order.
#include <gtest/gtest.h>

#include <fstream>

#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::run_tandem;
using testing::TempDir;

// Short horizon on purpose: after 2 steps the runs agree to about 1e-6
// (relative, per tensor); over longer runs the float differences of a
// different reduction order grow with training (about 1e-4 after 20 steps
// at lr 0.01, docs/DISTRIBUTED.md), so a long run could not tell a bug from
// rounding. A wrong gradient scale, a missing all-reduce or unsynchronised
// BatchNorm statistics shows up as 1e-2 or more after one step.
TEST(SyncBnCliTest, OneTwoAndFourRanksGiveTheSameWeights) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 64);
  for (int n : {1, 2, 4}) {
    auto r = run_tandem("train --nproc-per-node " + std::to_string(n) + " --data idx:" + dir.path() +
                        " --model convnet --batch-size 32 --max-steps 2 --sync-bn --progress off"
                        " --export-weights " + dir.file("w" + std::to_string(n) + ".safetensors"));
    ASSERT_EQ(r.exit_code, 0) << n << " ranks:\n" << r.output;
  }
  std::string script =
      "import sys\n"
      "from safetensors.torch import load_file\n"
      "a = load_file(sys.argv[1] + '/w1.safetensors')\n"
      "for n in (2, 4):\n"
      "    b = load_file(sys.argv[1] + f'/w{n}.safetensors')\n"
      "    assert a.keys() == b.keys()\n"
      "    worst = max(((a[k] - b[k]).norm() / (a[k].norm() + 1e-12)).item()\n"
      "                for k in a if a[k].is_floating_point())\n"
      "    print(n, worst)\n"
      "    assert worst <= 1e-5, f'{n} ranks: relative difference {worst}'\n";
  std::ofstream(dir.file("compare.py")) << script;
  auto r = run(std::string(TANDEM_PYTHON) + " " + dir.file("compare.py") + " " + dir.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

}  // namespace
}  // namespace tandem
