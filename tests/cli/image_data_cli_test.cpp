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

// Exported weights say which classes their outputs are (Trainer::
// weights_metadata); tandem eval refuses data whose labels mean others.
TEST(ImageDataCliTest, EvalRefusesDataOfOtherClassesThanTheWeights) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("train"), 3, 2, 20);
  testing::write_synthetic_image_folder(dir.file("other"), 3, 2, 20);
  std::filesystem::rename(dir.file("other/c1"), dir.file("other/c9"));
  std::filesystem::create_directories(dir.file("idx"));
  testing::write_synthetic_idx(dir.file("idx"), 64, 16);
  const std::string weights = dir.file("w.safetensors");
  auto r = run_tandem("train --data imagefolder:" + dir.file("train") + " --image-size 16 --model mlp "
                      "--max-steps 2 --batch-size 2 --progress off --export-weights " + weights);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto on = [&](const std::string& spec) {
    return "eval --model mlp --image-size 16 --weights " + weights + " --data " + spec + " --val-data " + spec;
  };
  r = run_tandem(on("imagefolder:" + dir.file("train")));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("(6 images)"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::tandem_fails(on("imagefolder:" + dir.file("other")), 1,
                                    weights + ": trained on the classes c0, c1, c2, but --data imagefolder:" +
                                        dir.file("other") + " has the class folders c0, c2, c9"));
  EXPECT_TRUE(testing::tandem_fails("eval --model mlp --image-size 16 --weights " + weights + " --data idx:" +
                                        dir.file("idx"),
                                    1, weights + ": trained on class folders (c0, c1, c2), but --data idx:" +
                                           dir.file("idx") + " numbers its labels (idx data)"));
}

// --val-data whose labels are numbers of another format, or beyond the
// training classes, is refused (a model of more outputs used to be built
// for it, scored against labels that mean other classes).
TEST(ImageDataCliTest, ValDataOfAnotherKindIsRefused) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.file("folders"), 3, 2, 20);
  testing::write_synthetic_cifar(dir.file("cifar"), 4, 8);
  const std::string common = " --model mlp --max-steps 2 --batch-size 2 --progress off";
  EXPECT_TRUE(testing::tandem_fails("train --data imagefolder:" + dir.file("folders") + " --val-data cifar10:" +
                                        dir.file("cifar") + " --image-size 32" + common,
                                    1, "--val-data cifar10:" + dir.file("cifar") + ": its labels are numbers"));
  EXPECT_TRUE(testing::tandem_fails("train --data cifar10:" + dir.file("cifar") + " --val-data imagefolder:" +
                                        dir.file("folders") + " --image-size 32" + common,
                                    1, "it names its classes by folder (c0, c1, c2) while --data cifar10:"));
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

// Every image unreadable: --skip-bad-images has nothing left, and says so
// (it used to name only the last file, as if it alone were bad). A
// --metrics-out in a missing folder is named with the reason, before training.
TEST(ImageDataCliTest, NothingReadableAndAnUnwritableMetricsFileAreSaidSo) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("d/a"));
  std::filesystem::create_directories(dir.file("d/b"));
  std::ofstream(dir.file("d/a/x.png")).flush();
  std::ofstream(dir.file("d/b/y.png")) << "GIF89a";
  EXPECT_TRUE(testing::tandem_fails("train --data imagefolder:" + dir.file("d") +
                                        " --image-size 16 --epochs 1 --skip-bad-images",
                                    1, "tandem: error: imagefolder:" + dir.file("d") +
                                           " (2 images, 2 classes): no image is readable, so --skip-bad-images "
                                           "leaves nothing (the last: " + dir.file("d/b/y.png") + ": not a JPEG or PNG"));
  std::filesystem::create_directories(dir.file("idx"));
  testing::write_synthetic_idx(dir.file("idx"), 512, 64);
  EXPECT_TRUE(testing::tandem_fails("train --data idx:" + dir.file("idx") + " --epochs 1 --metrics-out " +
                                        dir.file("no/m.jsonl"),
                                    1, "tandem: error: --metrics-out " + dir.file("no/m.jsonl") + ": " +
                                           dir.file("no") + " is not a folder this process can write to"));
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
