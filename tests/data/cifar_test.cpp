// CIFAR-10 / CIFAR-100 binary readers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "tandem/data/cifar.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;
using testing::error_of;

TEST(CifarTest, ReadsRecordsChannelMajor) {
  TempDir dir;
  auto written = testing::write_synthetic_cifar(dir.path(), 7, 5);
  auto splits = open_cifar(dir.path(), CifarKind::kCifar10);
  ASSERT_EQ(splits.train->size(), 35);
  ASSERT_EQ(splits.test->size(), 5);
  EXPECT_EQ(splits.train->num_classes(), 10);
  EXPECT_TRUE(torch::equal(splits.train->images(), written.images));
  EXPECT_TRUE(torch::equal(splits.train->labels(), written.labels));
  EXPECT_EQ(splits.train->label(3), written.labels[3].item<int64_t>());
  EXPECT_EQ(splits.train->image(8).sizes(), (std::vector<int64_t>{3, 32, 32}));
}

TEST(CifarTest, RecordLayoutByHand) {
  // One record: label 7, red plane all 1, green 2, blue 3 except pixel (row 1, col 2) of blue = 200.
  TempDir dir;
  std::string record(3073, '\0');
  record[0] = 7;
  for (int i = 0; i < 1024; ++i) {
    record[1 + i] = 1;
    record[1 + 1024 + i] = 2;
    record[1 + 2048 + i] = 3;
  }
  record[1 + 2048 + 32 * 1 + 2] = static_cast<char>(200);
  std::ofstream(dir.file("one.bin"), std::ios::binary) << record;
  auto source = read_cifar({dir.file("one.bin")}, CifarKind::kCifar10, "one");
  auto image = source->image(0);
  EXPECT_EQ(source->label(0), 7);
  EXPECT_EQ(image[0][5][5].item<int>(), 1);
  EXPECT_EQ(image[1][31][0].item<int>(), 2);
  EXPECT_EQ(image[2][0][0].item<int>(), 3);
  EXPECT_EQ(image[2][1][2].item<int>(), 200);
}

TEST(CifarTest, FindsTheArchiveFolder) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.file("cifar-10-batches-bin"), 2, 2);
  EXPECT_EQ(open_cifar(dir.path(), CifarKind::kCifar10).train->size(), 10);
}

TEST(CifarTest, Cifar100UsesFineLabels) {
  TempDir dir;
  std::string records;
  for (int i = 0; i < 3; ++i) {
    std::string r(3074, static_cast<char>(i));
    r[0] = static_cast<char>(19);      // coarse
    r[1] = static_cast<char>(90 + i);  // fine
    records += r;
  }
  std::ofstream(dir.file("train.bin"), std::ios::binary) << records;
  std::ofstream(dir.file("test.bin"), std::ios::binary) << records.substr(0, 3074);
  auto splits = open_cifar(dir.path(), CifarKind::kCifar100);
  EXPECT_EQ(splits.train->num_classes(), 100);
  EXPECT_EQ(splits.train->label(2), 92);
  EXPECT_EQ(splits.train->image(2)[1][3][4].item<int>(), 2);
  EXPECT_EQ(splits.test->size(), 1);
}

TEST(CifarTest, TruncatedFileNamesThePath) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.path(), 4, 2);
  std::filesystem::resize_file(dir.file("data_batch_1.bin"), 3073 * 3 + 100);
  auto message = error_of([&] { open_cifar(dir.path(), CifarKind::kCifar10); });
  EXPECT_NE(message.find(dir.file("data_batch_1.bin")), std::string::npos) << message;
  EXPECT_NE(message.find("not a whole number of 3073-byte cifar10 records"), std::string::npos)
      << message;
}

TEST(CifarTest, MissingFileAndFolder) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.path(), 2, 2);
  std::filesystem::remove(dir.file("test_batch.bin"));
  auto message = error_of([&] { open_cifar(dir.path(), CifarKind::kCifar10); });
  EXPECT_NE(message.find("missing " + dir.file("test_batch.bin")), std::string::npos) << message;
  message = error_of([&] { open_cifar(dir.file("nope"), CifarKind::kCifar10); });
  EXPECT_NE(message.find("cifar10:" + dir.file("nope") + ": no such directory"), std::string::npos)
      << message;
}

TEST(CifarTest, LabelOutOfRange) {
  TempDir dir;
  std::string record(3073, '\0');
  record[0] = 12;
  std::ofstream(dir.file("bad.bin"), std::ios::binary) << record << record;
  auto message = error_of([&] { read_cifar({dir.file("bad.bin")}, CifarKind::kCifar10, "x"); });
  EXPECT_NE(message.find("record 0 has label 12, expected 0..9"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::data
