// End-to-end on image data: `tandem train` on CIFAR-layout and ImageFolder
// data sets written by the test (real binary records, real JPEG and PNG
// files), and the errors a user sees for bad data.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tandem/data/image_io.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;
using testing::last_metrics;

TEST(ImageDataCliTest, Cifar10TrainsWellAboveChance) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.file("cifar"), 100, 200);
  auto r = run_tandem("train --data cifar10:" + dir.file("cifar") +
                      " --model convnet --epochs 3 --batch-size 50 --lr 0.05 --workers 2"
                      " --progress lines --metrics-out " + dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("cifar10:" + dir.file("cifar") + " train (500 images)"), std::string::npos)
      << r.output;
  auto m = last_metrics(dir.file("m.jsonl"));
  EXPECT_GE(m["test_acc"].get<double>(), 0.6) << r.output;  // chance: 0.1
}

TEST(ImageDataCliTest, ImageFolderTrainsWellAboveChance) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("train"), 4, 40, 36);
  testing::write_synthetic_image_folder(dir.file("val"), 4, 10, 36);
  auto r = run_tandem("train --data imagefolder:" + dir.file("train") + " --val-data imagefolder:" +
                      dir.file("val") + " --image-size 32 --model convnet --epochs 4"
                      " --batch-size 32 --lr 0.05 --workers 2 --progress lines --metrics-out " +
                      dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto m = last_metrics(dir.file("m.jsonl"));
  EXPECT_GE(m["test_acc"].get<double>(), 0.7) << r.output;  // chance: 0.25
}

TEST(ImageDataCliTest, ImageFolderWithoutValDataSkipsEvaluation) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 2, 6, 20);
  auto r = run_tandem("train --data imagefolder:" + dir.path() +
                      " --image-size 16 --epochs 1 --batch-size 4 --progress lines --metrics-out " +
                      dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("evaluation skipped"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("not evaluated"), std::string::npos) << r.output;
  EXPECT_TRUE(last_metrics(dir.file("m.jsonl"))["test_acc"].is_null());
}

// Labels are class folder indices: a --val-data whose class folders differ
// from --data's would be scored against the wrong labels. Refused, naming both.
TEST(ImageDataCliTest, ValDataWithOtherClassFoldersIsRefused) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("train"), 3, 2, 20);
  testing::write_synthetic_image_folder(dir.file("val"), 3, 2, 20);
  std::filesystem::rename(dir.file("val/c1"), dir.file("val/c9"));
  EXPECT_TRUE(testing::tandem_fails(
      "train --data imagefolder:" + dir.file("train") + " --val-data imagefolder:" + dir.file("val") +
          " --image-size 16 --epochs 1 --batch-size 2",
      1,
      "tandem: error: --val-data imagefolder:" + dir.file("val") +
          ": its classes (c0, c2, c9) are not those of --data imagefolder:" + dir.file("train") +
          " (c0, c1, c2)"));
}

TEST(ImageDataCliTest, TruncatedCifarBatchIsNamed) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.path(), 10, 10);
  std::filesystem::resize_file(dir.file("data_batch_1.bin"), 3073 * 5 + 17);
  EXPECT_TRUE(testing::tandem_fails("train --data cifar10:" + dir.path() + " --epochs 1", 1,
                                    "tandem: error: " + dir.file("data_batch_1.bin")));
}

TEST(ImageDataCliTest, EmptyImageFolderIsNamed) {
  TempDir dir;
  EXPECT_TRUE(testing::tandem_fails("train --data imagefolder:" + dir.path() + " --epochs 1", 1,
                                    "imagefolder:" + dir.path() + ": no class folders"));
  std::filesystem::create_directories(dir.file("cats"));
  EXPECT_TRUE(testing::tandem_fails("train --data imagefolder:" + dir.path() + " --epochs 1", 1,
                                    "no image files in class folder " + dir.file("cats")));
}

TEST(ImageDataCliTest, BadImageStopsTheRunUnlessSkipped) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 2, 8, 20);
  std::string bad = dir.file("c1/img003.png");
  std::filesystem::resize_file(bad, 60);  // truncated PNG
  std::string args = "train --data imagefolder:" + dir.path() +
                     " --image-size 16 --epochs 2 --batch-size 4 --workers 2 --progress lines"
                     " --metrics-out " + dir.file("m.jsonl");
  auto r = run_tandem(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem: error: " + bad + ": not a readable PNG"), std::string::npos)
      << r.output;

  r = run_tandem(args + " --skip-bad-images");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string warning = "tandem: warning: skipped " + bad + ": not a readable PNG";
  auto first = r.output.find(warning);
  ASSERT_NE(first, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find(warning, first + 1), std::string::npos) << "warned twice:\n" << r.output;
}

TEST(ImageDataCliTest, UnknownAugmentListsThePresets) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.path(), 4, 4);
  auto r = run_tandem("train --data cifar10:" + dir.path() + " --augment sparkle");
  EXPECT_NE(r.exit_code, 0);
  for (const char* name : {"sparkle", "none", "cifar", "imagenet", "heavy"}) {
    EXPECT_NE(r.output.find(name), std::string::npos) << name << " missing in " << r.output;
  }
}

}  // namespace
}  // namespace tandem
