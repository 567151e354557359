// ImageFolder: indexing identical to torchvision's, errors, decoding through
// the transformed dataset, and skipping unreadable images.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "tandem/data/augment.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/loader.h"
#include "tandem/data/image_io.h"
#include "tandem/data/transforms.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;
using testing::error_of;
namespace fs = std::filesystem;

void touch(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "x";
}

TEST(ImageFolderTest, IndexesLikeTorchvision) {
  TempDir dir;
  const std::string d = dir.path();
  for (const char* p : {"b/1.jpg", "a/2.png", "a/sub/z.jpeg", "a/sub/deeper/0.jpg", "a/y.JPG",
                        "a/notes.txt", "a/A.png", "B/x.webp", "a b/k.bmp", "\xc3\xa4/u.png",
                        "10/a.jpg", "9/a.jpg", ".hidden/h.png", "a_/q.tif", "b/.dot.jpg"}) {
    touch(d + "/" + p);
  }
  touch(d + "/stray.jpg");  // a file at the top is not a class
  ImageFolderSource source(d);

  std::string script =
      "import sys, torchvision\n"
      "ds = torchvision.datasets.ImageFolder(sys.argv[1], loader=lambda p: p)\n"
      "print('\\n'.join(ds.classes)); print('--')\n"
      "for p, l in ds.samples: print(f'{p}\\t{l}')\n";
  std::ofstream(dir.file("list.py")) << script;
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " + dir.file("list.py") + " " + d);
  ASSERT_EQ(result.exit_code, 0) << result.output;

  std::ostringstream ours;
  for (const auto& c : source.classes()) ours << c << "\n";
  ours << "--\n";
  for (int64_t i = 0; i < source.size(); ++i) ours << source.name(i) << "\t" << source.label(i) << "\n";
  EXPECT_EQ(ours.str(), result.output);
  EXPECT_EQ(source.size(), 14);
}

// Links are followed, as torchvision's os.walk(followlinks=True) does, but a
// link back to a folder the walk is inside (a loop) is an error naming it:
// two such links used to make the walk run for ever.
TEST(ImageFolderTest, LinksAreFollowedButALoopIsAnError) {
  TempDir dir;
  touch(dir.file("data/cats/1.jpg"));
  touch(dir.file("elsewhere/more/2.jpg"));
  fs::create_symlink(dir.file("elsewhere"), dir.file("data/cats/linked"));  // followed
  ImageFolderSource source(dir.file("data"));
  EXPECT_EQ(source.size(), 2);
  fs::create_symlink("..", dir.file("data/cats/up"));
  fs::create_symlink("..", dir.file("data/cats/up2"));
  EXPECT_EQ(error_of([&] { ImageFolderSource looped(dir.file("data")); }),
            dir.file("data/cats/up") + ": a link back to a folder that contains it (a loop); class folders must "
            "not loop");
  fs::remove(dir.file("data/cats/up"));
  fs::remove(dir.file("data/cats/up2"));
  fs::create_symlink(".", dir.file("data/cats/self"));
  EXPECT_EQ(error_of([&] { ImageFolderSource looped(dir.file("data")); }),
            dir.file("data/cats/self") + ": a link back to a folder that contains it (a loop); class folders must "
            "not loop");
}

TEST(ImageFolderTest, EmptyClassFolderIsAnError) {
  TempDir dir;
  touch(dir.file("cats/1.jpg"));
  fs::create_directories(dir.file("dogs"));
  touch(dir.file("dogs/readme.txt"));
  auto message = error_of([&] { ImageFolderSource source(dir.path()); });
  EXPECT_NE(message.find("no image files in class folder " + dir.file("dogs")), std::string::npos)
      << message;
}

TEST(ImageFolderTest, NoClassesAndMissingFolder) {
  TempDir dir;
  touch(dir.file("loose.jpg"));
  auto message = error_of([&] { ImageFolderSource source(dir.path()); });
  EXPECT_NE(message.find("imagefolder:" + dir.path() + ": no class folders"), std::string::npos)
      << message;
  message = error_of([&] { ImageFolderSource source(dir.file("absent")); });
  EXPECT_NE(message.find(dir.file("absent") + ": no such directory"), std::string::npos) << message;
}

TEST(ImageFolderTest, DecodesJpegAndPng) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 3, 4, 20);
  ImageFolderSource source(dir.path());
  ASSERT_EQ(source.size(), 12);
  EXPECT_EQ(source.num_classes(), 3);
  EXPECT_EQ(source.label(11), 2);
  auto png = source.image(1);  // img001.png
  EXPECT_EQ(png.sizes(), (std::vector<int64_t>{3, 20 + 3, 20 + 5}));
  EXPECT_EQ(source.image(0).size(0), 3);
}

// Note [decoding only the crop]: with RandomResizedCrop first, samples come
// from partial JPEG decodes; they equal the samples made from whole images.
TEST(ImageFolderTest, CropFirstSamplesEqualWholeImageSamples) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 2, 6, 120);
  for (const char* preset : {"imagenet", "heavy"}) {
    SCOPED_TRACE(preset);
    AugmentOptions augment;
    augment.name = preset;
    augment.image_size = 48;
    augment.mean = {0.5, 0.5, 0.5};
    augment.std = {0.25, 0.25, 0.25};
    TransformedDataset dataset(std::make_shared<ImageFolderSource>(dir.path()),
                               make_train_transform(augment, 0, 0), {/*seed=*/3});
    ASSERT_TRUE(dataset.crops_first());
    for (int64_t epoch = 0; epoch < 4; ++epoch) {
      for (int64_t i = 0; i < dataset.size(); ++i) {
        auto fast = dataset.sample(i, epoch);
        ASSERT_EQ(fast.sizes(), (std::vector<int64_t>{3, 48, 48}));
        ASSERT_TRUE(torch::equal(fast, dataset.sample_whole(i, epoch))) << "epoch " << epoch << " index " << i;
      }
    }
  }
}

// A run's data does not depend on the number of loader threads: every batch
// of an augmented epoch is the same with 0, 1 and 3 workers.
TEST(ImageFolderTest, AugmentedBatchesDoNotDependOnWorkers) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 3, 7, 60);
  AugmentOptions augment;
  augment.name = "heavy";
  augment.image_size = 32;
  augment.mean = {0.5, 0.5, 0.5};
  augment.std = {0.25, 0.25, 0.25};
  auto dataset = std::make_shared<TransformedDataset>(std::make_shared<ImageFolderSource>(dir.path()),
                                                      make_train_transform(augment, 0, 0),
                                                      TransformedDatasetOptions{/*seed=*/5});
  auto batches = [&](int64_t workers, int64_t epoch) {
    LoaderOptions options;
    options.batch_size = 4;
    options.workers = workers;
    DataLoader loader(dataset, std::make_shared<RandomSampler>(dataset->size(), 5), options);
    std::vector<Batch> out;
    auto it = loader.epoch(epoch);
    while (auto b = it->next()) out.push_back(*b);
    return out;
  };
  for (int64_t epoch : {0, 1}) {
    auto reference = batches(0, epoch);
    ASSERT_EQ(reference.size(), 6u);
    for (int64_t workers : {1, 3}) {
      auto other = batches(workers, epoch);
      ASSERT_EQ(other.size(), reference.size());
      for (size_t b = 0; b < reference.size(); ++b) {
        EXPECT_TRUE(torch::equal(other[b].inputs, reference[b].inputs)) << workers << " workers, batch " << b;
        EXPECT_TRUE(torch::equal(other[b].targets, reference[b].targets));
      }
    }
  }
  // Epochs differ.
  EXPECT_FALSE(torch::equal(batches(0, 0)[0].inputs, batches(0, 1)[0].inputs));
}

// get_batch makes each sample in its row of the batch (Note [tabulated
// finish]) or copies it there: either way the rows are the samples, in
// order, and a skipped image leaves no gap.
TEST(ImageFolderTest, BatchRowsAreTheSamplesAndSkippedImagesLeaveNoGap) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 2, 4, 40);
  touch(dir.path() + "/class001/zz-not-an-image.jpg");
  AugmentOptions normalized;
  normalized.image_size = 24;
  normalized.mean = {0.5, 0.5, 0.5};
  normalized.std = {0.25, 0.25, 0.25};
  RandomHorizontalFlip flip(FlipOptions{0.5});
  std::vector<std::pair<std::string, TransformPtr>> pipelines;
  for (const char* preset : {"heavy", "imagenet", "none"}) {
    normalized.name = preset;
    pipelines.emplace_back(preset, make_train_transform(normalized, 0, 0));
  }
  // Made and then copied in: a float transform after ToTensor.
  ResizeOptions resize;
  resize.size = {24, 24};
  pipelines.emplace_back("copied", std::make_shared<Compose>(std::vector<TransformPtr>{
                                       std::make_shared<Resize>(resize), std::make_shared<ToTensor>(),
                                       std::make_shared<RandomHorizontalFlip>(FlipOptions{0.5})}));
  // A view of a finished image (CenterCrop after ToTensor), copied in.
  ResizeOptions larger;
  larger.size = {30, 30};
  CenterCropOptions crop;
  crop.size = {24};
  pipelines.emplace_back("view", std::make_shared<Compose>(std::vector<TransformPtr>{
                                     std::make_shared<Resize>(larger), std::make_shared<ToTensor>(),
                                     std::make_shared<CenterCrop>(crop)}));
  for (const auto& [name, transform] : pipelines) {
    SCOPED_TRACE(name);
    TransformedDataset dataset(std::make_shared<ImageFolderSource>(dir.path()), transform,
                               {/*seed=*/7, /*skip_bad_images=*/true});
    ASSERT_EQ(dataset.size(), 9);
    std::vector<int64_t> indices = {8, 2, 5, 0, 7, 1, 3, 6, 4};
    auto batch = dataset.get_batch(indices, /*epoch=*/1);
    std::vector<torch::Tensor> want;
    for (int64_t i : indices) {
      try {
        want.push_back(dataset.sample(i, 1));
      } catch (const ImageError&) {
      }
    }
    ASSERT_EQ(want.size(), 8u);
    ASSERT_EQ(batch.size(), 8);
    ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{8, 3, 24, 24}));
    EXPECT_TRUE(torch::equal(batch.inputs, torch::stack(want)));
    EXPECT_EQ(batch.inputs.storage().nbytes(), batch.inputs.numel() * sizeof(float));
    EXPECT_EQ(dataset.skipped(), 1);
    // Without a skip, every row is written.
    auto whole = dataset.get_batch({0, 1, 2}, 1);
    EXPECT_TRUE(torch::equal(whole.inputs, torch::stack({dataset.sample(0, 1), dataset.sample(1, 1),
                                                          dataset.sample(2, 1)})));
  }
}

}  // namespace
}  // namespace tandem::data
