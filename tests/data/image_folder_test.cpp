// ImageFolder: indexing identical to torchvision's, errors, decoding through
// the transformed dataset, and skipping unreadable images.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "tandem/data/image_folder.h"
#include "tandem/data/image_io.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

void touch(const std::string& path) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path) << "x";
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no tandem::Error";
  return "";
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

}  // namespace
}  // namespace tandem::data
