// data::check_same_classes: evaluation data must label the training data's
// classes, or the accuracy it gives means nothing.
#include <gtest/gtest.h>

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
  EXPECT_EQ(refusal("idx:/a", numbered(10), "idx:/b", numbered(12)),
            "--val-data idx:/b: labels up to 11, but --data idx:/a has 10 classes (labels 0 to 9), which the "
            "model's outputs are");
}

}  // namespace
}  // namespace tandem::data
