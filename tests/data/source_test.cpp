// Evaluation data (--val-data) against the training data: its labels must
// mean the training classes (data::check_same_classes), and an IDX set is
// normalised with the training data's statistics (open_eval_data).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tandem/data/idx.h"
#include "tandem/data/source.h"
#include "testing.h"

namespace tandem::data {
namespace {

DatasetInfo numbered(int64_t classes) { return {1, 28, 28, classes, {}}; }
DatasetInfo named(std::vector<std::string> names) {
  const auto n = static_cast<int64_t>(names.size());
  return {3, 32, 32, n, std::move(names)};
}

std::string refusal(const std::string& train_spec, const DatasetInfo& train, const std::string& eval_spec,
                    const DatasetInfo& eval) {
  return testing::error_of([&] { check_same_classes(train_spec, train, eval_spec, eval, "--val-data "); });
}

TEST(SourceTest, EvaluationDataMustLabelTheTrainingClasses) {
  // Accepted: the same data, the same class folders, numbered labels of the
  // same format within the training classes (a test split may lack some).
  EXPECT_NO_THROW(check_same_classes("idx:/a", numbered(10), "idx:/a", numbered(12), "--val-data "));
  EXPECT_NO_THROW(check_same_classes("imagefolder:/t", named({"cat", "dog"}), "imagefolder:/v",
                                     named({"cat", "dog"}), "--val-data "));
  EXPECT_NO_THROW(check_same_classes("idx:/a", numbered(10), "fashion-mnist", numbered(10), "--val-data "));
  EXPECT_NO_THROW(check_same_classes("idx:/a", numbered(10), "idx:/b", numbered(8), "--val-data "));

  EXPECT_EQ(refusal("imagefolder:/t", named({"cat", "dog", "eel"}), "imagefolder:/v", named({"cat", "dog", "fox"})),
            "--val-data imagefolder:/v: its classes (cat, dog, fox) are not those of --data imagefolder:/t "
            "(cat, dog, eel); labels are class folder indices, so both need the same class folders");
  EXPECT_EQ(refusal("imagefolder:/t", named({"cat", "dog", "eel"}), "cifar10:/c", numbered(10)),
            "--val-data cifar10:/c: its labels are numbers (cifar10 data) while --data imagefolder:/t names "
            "its classes by folder (cat, dog, eel): nothing says which number is which class; evaluate on an "
            "imagefolder with the same class folders");
  EXPECT_EQ(refusal("cifar10:/c", numbered(10), "imagefolder:/v", named({"cat", "dog", "eel"})),
            "--val-data imagefolder:/v: it names its classes by folder (cat, dog, eel) while --data cifar10:/c "
            "numbers them (cifar10 data): nothing says which folder is which number; evaluate on data of the "
            "training data's kind");
  EXPECT_EQ(refusal("cifar100:/c", numbered(100), "cifar10:/d", numbered(10)),
            "--val-data cifar10:/d: cifar10 labels, but --data cifar100:/c is cifar100 data: the same numbers "
            "name other classes; evaluate on data of the same kind");
  // What the specs alone show is refused before the evaluation data is read
  // (a folder that does not exist here).
  EXPECT_EQ(testing::error_of([] { check_same_label_kind("cifar10:/c", numbered(10), "idx:/absent", "--val-data "); }),
            "--val-data idx:/absent: idx labels, but --data cifar10:/c is cifar10 data: the same numbers name "
            "other classes; evaluate on data of the same kind");
  EXPECT_NO_THROW(check_same_label_kind("cifar10:/c", numbered(10), "imagefolder:/v", "--val-data "));
  EXPECT_NO_THROW(check_same_label_kind("idx:/a", numbered(10), "fashion-mnist", "--val-data "));
  EXPECT_EQ(refusal("idx:/a", numbered(10), "idx:/b", numbered(12)),
            "--val-data idx:/b: labels up to 11, but --data idx:/a has 10 classes (labels 0 to 9), which the "
            "model's outputs are");
}

// --val-data idx:DIR after IDX training data reads DIR's test split alone
// (a folder of t10k files will do) and normalises it with the training
// data's statistics, as the training data's own test split is: the same
// test images give the same inputs whatever DIR's training images are.
TEST(SourceTest, IdxEvaluationDataIsNormalisedAsTheTrainingDataIs) {
  testing::TempDir a, b;
  testing::write_synthetic_idx(a.path(), 256, 32);
  for (const char* file : {"t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"}) {
    std::filesystem::copy_file(a.file(file), b.file(file));
  }
  for (const auto& options : {DataOptions{}, DataOptions{"none", 32}}) {
    auto training = open_data("idx:" + a.path(), options);
    auto own = training.test->get_batch({0, 5, 31}, 0);
    auto other = open_eval_data("idx:" + b.path(), options, &training)->get_batch({0, 5, 31}, 0);
    EXPECT_TRUE(torch::equal(own.inputs, other.inputs)) << options.image_size;
    EXPECT_TRUE(torch::equal(own.targets, other.targets));
  }
  // With training files of other statistics in DIR: still the training data's.
  testing::write_synthetic_idx(b.path(), 64, 32);
  auto t10k = read_idx(a.file("t10k-images-idx3-ubyte"), 3);
  testing::write_idx(b.file("t10k-images-idx3-ubyte"), t10k, false);
  testing::write_idx(b.file("t10k-labels-idx1-ubyte"), read_idx(a.file("t10k-labels-idx1-ubyte"), 1), false);
  testing::write_idx(b.file("train-images-idx3-ubyte"), read_idx(b.file("train-images-idx3-ubyte"), 3) / 2, false);
  auto training = open_data("idx:" + a.path());
  EXPECT_TRUE(torch::equal(training.test->get_batch({1, 2}, 0).inputs,
                           open_eval_data("idx:" + b.path(), {}, &training)->get_batch({1, 2}, 0).inputs));
}

// Note [content digest]: what tells two data sets of one size apart when
// the ranks compare their settings. The same files give the same digest
// however they are read (the in-memory IDX path or the transforms'), other
// labels or other images another, and an image folder's class names count.
// The uint8 test images of an IDX folder, as open_idx reads them.
torch::Tensor plain_test_images(const std::string& dir) {
  return std::static_pointer_cast<const IdxDataset>(open_idx(dir).test)->images().to(torch::kInt64);
}

TEST(SourceTest, ContentDigestTellsDataSetsOfOneSizeApart) {
  testing::TempDir a, b, c;
  testing::write_synthetic_idx(a.path(), 200, 50);
  testing::write_synthetic_idx(b.path(), 200, 50);
  testing::write_idx(b.file("train-labels-idx1-ubyte"), torch::arange(200, torch::kInt64).remainder(10), false);
  auto plain = open_data("idx:" + a.path());
  DataOptions resized;
  resized.image_size = 32;
  auto transformed = open_data("idx:" + a.path(), resized);
  auto other = open_data("idx:" + b.path());
  ASSERT_EQ(other.train->size(), plain.train->size());
  EXPECT_NE(plain.train->content_digest(), 0u);
  EXPECT_EQ(transformed.train->content_digest(), plain.train->content_digest());
  EXPECT_EQ(transformed.test->content_digest(), plain.test->content_digest());
  EXPECT_NE(other.train->content_digest(), plain.train->content_digest());
  EXPECT_EQ(other.test->content_digest(), plain.test->content_digest());  // the same test files
  EXPECT_NE(plain.test->content_digest(), plain.train->content_digest());
  // The same labels with other pixels: one pixel of one test image.
  testing::write_synthetic_idx(c.path(), 200, 50);
  auto images = plain_test_images(a.path());
  images.index_put_({49, 27, 27}, (images.index({49, 27, 27}) + 1).remainder(256));
  testing::write_idx(c.file("t10k-images-idx3-ubyte"), images, false);
  auto changed = open_data("idx:" + c.path());
  EXPECT_EQ(changed.train->content_digest(), plain.train->content_digest());
  EXPECT_NE(changed.test->content_digest(), plain.test->content_digest());

  testing::TempDir cifar, cifar_copy;
  testing::write_synthetic_cifar(cifar.path(), 20, 10);
  testing::write_synthetic_cifar(cifar_copy.path(), 20, 10);
  EXPECT_EQ(open_data("cifar10:" + cifar.path()).train->content_digest(),
            open_data("cifar10:" + cifar_copy.path()).train->content_digest());
  EXPECT_NE(open_data("cifar10:" + cifar.path()).train->content_digest(),
            open_data("cifar10:" + cifar.path()).test->content_digest());
  {  // one byte of the last test record's pixels (its label is its first byte)
    std::fstream file(cifar_copy.file("test_batch.bin"), std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char last = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(last + 1));
  }
  EXPECT_NE(open_data("cifar10:" + cifar.path()).test->content_digest(),
            open_data("cifar10:" + cifar_copy.path()).test->content_digest());

  testing::TempDir folder, renamed;
  testing::write_synthetic_image_folder(folder.path(), 2, 3, 16);
  testing::write_synthetic_image_folder(renamed.path(), 2, 3, 16);
  std::filesystem::rename(renamed.file("c1"), renamed.file("d1"));
  const auto first = open_data("imagefolder:" + folder.path()).train->content_digest();
  EXPECT_EQ(open_data("imagefolder:" + folder.path()).train->content_digest(), first);
  EXPECT_NE(open_data("imagefolder:" + renamed.path()).train->content_digest(), first);
}

}  // namespace
}  // namespace tandem::data
