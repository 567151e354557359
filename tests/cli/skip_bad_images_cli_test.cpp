// --skip-bad-images over ranks: batches of unequal sizes still give one
// process's weights, and every rank reports the images it left out.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::expect_close_weights;
using testing::run_tandem;
using testing::TempDir;

// --skip-bad-images leaves the ranks' batches of different sizes. Note
// [unequal batches]: each rank's loss is weighted by its share of the global
// batch, so 2 ranks still give one process's weights (in float64, to
// rounding; unweighted, 3e-2), the epoch's images are counted over the ranks
// (train accuracy never above 100%), and every rank reports the images it
// left out, as `tandem eval` does. The pipeline over ranks cuts a batch
// shorter than --micro-batches into one micro-batch per row.
TEST(SkipBadImagesCliTest, RanksOfUnequalBatchesAreOneProcess) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("images"), 2, 20, 20);
  std::vector<std::string> bad;
  for (const char* name : {"c0/img001.png", "c0/img004.jpg", "c0/img005.png", "c0/img008.jpg", "c1/img002.jpg",
                           "c1/img003.png", "c1/img010.jpg", "c1/img013.png", "c1/img016.jpg"}) {
    bad.push_back(dir.file("images/") + name);
    std::filesystem::resize_file(bad.back(), 0);
  }
  const std::string data = "--data imagefolder:" + dir.file("images") +
                           " --image-size 16 --augment none --model mlp --dtype float64 --skip-bad-images ";
  auto train = [&](const std::string& flags, const std::string& name) {
    auto r = run_tandem("train " + data + "--batch-size 8 --epochs 2 --lr 0.05 --progress off --export-weights " +
                        dir.file(name + ".safetensors") + " --metrics-out " + dir.file(name + ".jsonl") + " " +
                        flags);
    EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.output;
    for (const auto& path : bad) {
      EXPECT_NE(r.output.find("tandem: warning: skipped " + path + ": "), std::string::npos)
          << flags << ": " << path << " not reported:\n" << r.output;
    }
    return testing::last_metrics(dir.file(name + ".jsonl"));
  };
  auto one = train("--nproc-per-node 0", "one");
  auto two = train("--nproc-per-node 2", "two");
  ASSERT_FALSE(one.is_null());
  ASSERT_FALSE(two.is_null());
  EXPECT_NEAR(two["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-9);
  EXPECT_NEAR(two["train_acc"].get<double>(), one["train_acc"].get<double>(), 1e-9);
  EXPECT_LE(two["train_acc"].get<double>(), 1.0);
  expect_close_weights(dir, "one.safetensors", {{"two.safetensors", "2 ranks, unequal batches"}}, 1e-12);

  auto pipeline = train("--nproc-per-node 2 --strategy pipeline --micro-batches 8", "stages");
  EXPECT_NEAR(pipeline["train_loss"].get<double>(), one["train_loss"].get<double>(), 1e-9);
  expect_close_weights(dir, "one.safetensors", {{"stages.safetensors", "2 pipeline ranks"}}, 1e-12);

  auto r = run_tandem("launch --nproc-per-node 2 -- " TANDEM_CLI " eval " + data + "--val-data imagefolder:" +
                      dir.file("images") + " --weights " + dir.file("one.safetensors"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const auto& path : bad) {
    EXPECT_NE(r.output.find("tandem: warning: skipped " + path + ": "), std::string::npos)
        << "eval: " << path << " not reported:\n" << r.output;
  }
}

}  // namespace
}  // namespace tandem
