#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <utility>

#include <zlib.h>

#include "tandem/data/idx.h"
#include "tandem/data/source.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;

// The message of the tandem::Error that `f` throws.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(IdxTest, ReadsPlainAndGzipFilesAlike) {
  TempDir dir;
  auto data = torch::arange(2 * 3 * 4, torch::kInt64).reshape({2, 3, 4}).to(torch::kUInt8);
  testing::write_idx(dir.file("plain"), data, /*gzip=*/false);
  testing::write_idx(dir.file("packed.gz"), data, /*gzip=*/true);
  EXPECT_TRUE(torch::equal(read_idx(dir.file("plain"), 3), data));
  EXPECT_TRUE(torch::equal(read_idx(dir.file("packed.gz"), 3), data));
}

TEST(IdxTest, WrongMagicNamesTheFileAndBothNumbers) {
  TempDir dir;
  testing::write_idx(dir.file("labels"), torch::zeros({5}, torch::kUInt8), false);
  auto message = error_of([&] { read_idx(dir.file("labels"), 3); });
  EXPECT_NE(message.find(dir.file("labels")), std::string::npos) << message;
  EXPECT_NE(message.find("magic number 0x00000801, expected 0x00000803"), std::string::npos)
      << message;
}

TEST(IdxTest, TruncatedDataNamesTheFileAndTheShortfall) {
  TempDir dir;
  testing::write_idx(dir.file("images"), torch::zeros({4, 28, 28}, torch::kUInt8), false);
  std::filesystem::resize_file(dir.file("images"), 16 + 1000);
  auto message = error_of([&] { read_idx(dir.file("images"), 3); });
  EXPECT_NE(message.find(dir.file("images") + ": truncated: expected 3136 bytes of data, found 1000"),
            std::string::npos)
      << message;
}

TEST(IdxTest, TruncatedGzipIsAnErrorNotAShortRead) {
  TempDir dir;
  testing::write_idx(dir.file("images.gz"), torch::randint(0, 255, {64, 28, 28}).to(torch::kUInt8),
                     true);
  auto size = std::filesystem::file_size(dir.file("images.gz"));
  std::filesystem::resize_file(dir.file("images.gz"), size / 2);
  auto message = error_of([&] { read_idx(dir.file("images.gz"), 3); });
  EXPECT_NE(message.find(dir.file("images.gz")), std::string::npos) << message;
}

TEST(IdxTest, TrailingBytesAreRejected) {
  TempDir dir;
  testing::write_idx(dir.file("labels"), torch::zeros({5}, torch::kUInt8), false);
  std::ofstream(dir.file("labels"), std::ios::app) << "xyz";
  EXPECT_NE(error_of([&] { read_idx(dir.file("labels"), 1); }).find("unexpected bytes"),
            std::string::npos);
}

// Note [gzip input]: a gzip file of several members (`cat a.gz b.gz`) reads
// as their concatenation; bytes after the last member are refused, which
// zlib's gzread used to skip unseen; a cut or corrupt stream is named.
TEST(IdxTest, GzipMembersAreJoinedAndBytesAfterThemRefused) {
  TempDir dir;
  auto data = torch::randint(0, 255, {40, 28, 28}).to(torch::kUInt8);
  testing::write_idx(dir.file("plain"), data, /*gzip=*/false);
  const std::string bytes = testing::read_text(dir.file("plain"));
  const size_t half = bytes.size() / 2;
  for (const auto& [mode, part] : {std::pair{"wb", bytes.substr(0, half)}, std::pair{"ab", bytes.substr(half)}}) {
    gzFile file = gzopen(dir.file("two.gz").c_str(), mode);  // "ab": a second member
    ASSERT_EQ(gzwrite(file, part.data(), static_cast<unsigned>(part.size())), static_cast<int>(part.size()));
    ASSERT_EQ(gzclose(file), Z_OK);
  }
  EXPECT_TRUE(torch::equal(read_idx(dir.file("two.gz"), 3), data));

  testing::write_idx(dir.file("padded.gz"), data, /*gzip=*/true);
  std::ofstream(dir.file("padded.gz"), std::ios::app | std::ios::binary) << std::string(512, '\0');
  EXPECT_EQ(error_of([&] { read_idx(dir.file("padded.gz"), 3); }),
            dir.file("padded.gz") + ": unexpected bytes after the gzip stream");

  // A flipped byte inside the compressed data, then one in the CRC.
  testing::write_idx(dir.file("bad.gz"), data, /*gzip=*/true);
  std::string packed = testing::read_text(dir.file("bad.gz"));
  for (const size_t at : {packed.size() / 2, packed.size() - 6}) {
    std::string damaged = packed;
    damaged[at] = static_cast<char>(damaged[at] ^ 0x55);
    std::ofstream(dir.file("bad.gz"), std::ios::binary | std::ios::trunc) << damaged;
    const auto message = error_of([&] { read_idx(dir.file("bad.gz"), 3); });
    EXPECT_EQ(message.rfind(dir.file("bad.gz") + ": ", 0), 0u) << message;
    EXPECT_TRUE(message.find("cannot read (") != std::string::npos || message.find(": truncated") != std::string::npos ||
                message.find(": unexpected bytes") != std::string::npos)
        << message;
  }
}

// Found by fuzz/fuzz_idx (fuzz/regressions/idx): a header whose sizes
// multiply past int64 was an uncaught libtorch error; a header claiming
// gigabytes over a short file made the reader allocate them first. Both are
// now clear errors, and memory follows the bytes that actually arrive.
TEST(IdxTest, LyingHeadersAreClearErrors) {
  testing::TempDir dir;
  auto write = [&](const std::string& name, const std::vector<unsigned char>& bytes) {
    std::ofstream out(dir.file(name), std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return dir.file(name);
  };
  auto overflow = write("overflow", {0, 0, 8, 3, 0x7f, 0xff, 0xff, 0xff, 0x7f, 0xff, 0xff, 0xff,
                                     0x7f, 0xff, 0xff, 0xff, 1, 2, 3});
  EXPECT_NE(error_of([&] { read_idx(overflow, 3); }).find(overflow + ": implausible total size"),
            std::string::npos);
  auto huge = write("huge", {0, 0, 8, 3, 0, 0, 0, 2, 0x10, 0, 0, 0, 0, 0, 0, 2, 1, 2, 3});
  EXPECT_NE(error_of([&] { read_idx(huge, 3); })
                .find(huge + ": truncated: expected 1073741824 bytes of data, found 3"),
            std::string::npos) << error_of([&] { read_idx(huge, 3); });
}

TEST(IdxTest, MissingDirectoryAndMissingFileAreNamed) {
  EXPECT_EQ(error_of([] { open_data("idx:/no/such/dir"); }), "idx:/no/such/dir: no such directory");
  TempDir dir;
  std::ofstream(dir.file("a-file")) << "x";
  EXPECT_EQ(error_of([&] { open_data("idx:" + dir.file("a-file")); }), "idx:" + dir.file("a-file") + ": is a regular file; expected a folder");
  EXPECT_NE(error_of([&] { open_data("idx:" + dir.path()); })
                .find("missing train-images-idx3-ubyte (or train-images-idx3-ubyte.gz)"),
            std::string::npos);
  EXPECT_NE(error_of([] { open_data("cifar:/x"); }).find("unknown data spec 'cifar:/x'"),
            std::string::npos);
}

// IDX has no class count: it is the training labels' largest plus one. A
// damaged label byte (255) made a 256-class model, silently; now the classes
// must each have a training image and the test labels must be among them.
TEST(IdxTest, ALabelBeyondTheClassesIsNamed) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  auto set_label = [&](const std::string& file, int64_t item, uint8_t label) {
    auto labels = read_idx(dir.file(file), 1);
    labels[item] = label;
    testing::write_idx(dir.file(file), labels, /*gzip=*/false);
  };
  set_label("t10k-labels-idx1-ubyte", 3, 255);
  EXPECT_EQ(error_of([&] { open_data("idx:" + dir.path()); }),
            dir.file("t10k-labels-idx1-ubyte") + ": item 3 has label 255, but the training labels are 0..9");
  set_label("t10k-labels-idx1-ubyte", 3, 9);
  set_label("train-labels-idx1-ubyte", 5, 12);
  EXPECT_EQ(error_of([&] { open_data("idx:" + dir.path()); }),
            dir.file("train-labels-idx1-ubyte") + ": item 5 has label 12, but class 10 has no training "
            "image (2 classes below it have none); expected labels 0..K-1, every class present (a "
            "damaged label?)");
}

// Training images that are all one value have a standard deviation of 0:
// normalising them would make every input NaN. Refused, naming the file.
TEST(IdxTest, ImagesWithoutVarianceAreRefused) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  testing::write_idx(dir.file("train-images-idx3-ubyte"), torch::full({64, 28, 28}, 7, torch::kUInt8), false);
  EXPECT_EQ(error_of([&] { open_data("idx:" + dir.path()); }),
            dir.file("train-images-idx3-ubyte") + ": every pixel of the 64 training images is 7: images "
            "without any variance cannot be normalised (standard deviation 0); expected images that differ");
}

TEST(IdxTest, DatasetNormalisesWithTrainingStatistics) {
  TempDir dir;
  auto train = testing::write_synthetic_idx(dir.path(), 200, 50, /*gzip=*/true);
  auto splits = open_data("idx:" + dir.path());
  ASSERT_EQ(splits.train->size(), 200);
  ASSERT_EQ(splits.test->size(), 50);
  auto info = splits.train->info();
  EXPECT_EQ(info.channels, 1);
  EXPECT_EQ(info.height, 28);
  EXPECT_EQ(info.num_classes, 10);
  auto batch = splits.train->get_batch({3, 0, 7}, /*epoch=*/0);
  EXPECT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{3, 1, 28, 28}));
  EXPECT_EQ(batch.targets.scalar_type(), torch::kInt64);
  auto pixels = train.to(torch::kFloat64) / 255.0;
  auto expected = (pixels[3] - pixels.mean()) / pixels.std();
  EXPECT_TRUE(torch::allclose(batch.inputs[0][0].to(torch::kFloat64), expected, 1e-5, 1e-5));
}

TEST(IdxTest, FashionMnistFromDebianHasTheKnownShape) {
  auto splits = open_data("fashion-mnist");
  EXPECT_EQ(splits.train->size(), 60000);
  EXPECT_EQ(splits.test->size(), 10000);
  EXPECT_EQ(splits.train->info().num_classes, 10);
}

}  // namespace
}  // namespace tandem::data
