// tandem/data/cifar.h: the CIFAR-10 and CIFAR-100 binary formats.
//
// CIFAR-10 (cifar-10-batches-bin): data_batch_1.bin .. data_batch_5.bin for
// training and test_batch.bin for evaluation; each record is 1 label byte
// then 3072 pixel bytes, channel-major (1024 red, 1024 green, 1024 blue, each
// 32 rows of 32). CIFAR-100 (cifar-100-binary): train.bin and test.bin with
// records of a coarse label byte, a fine label byte, then the same 3072
// pixels; tandem trains on the 100 fine labels. See docs/DATA.md.
#pragma once

#include <string>
#include <vector>

#include "tandem/data/image_dataset.h"

namespace tandem::data {

// All the records of some CIFAR files, in memory: images uint8 [N, 3, 32, 32].
class CifarSource : public ImageSource {
 public:
  CifarSource(torch::Tensor images, torch::Tensor labels, int64_t num_classes,
              std::string description);

  int64_t size() const override { return images_.size(0); }
  int64_t num_classes() const override { return num_classes_; }
  torch::Tensor image(int64_t index) const override { return images_[index]; }
  int64_t label(int64_t index) const override { return labels_[index].item<int64_t>(); }
  std::string name(int64_t index) const override;
  std::string describe() const override { return description_; }

  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }
  uint32_t content_digest() const override;

 private:
  torch::Tensor images_, labels_;  // uint8 [N, 3, 32, 32], int64 [N]
  int64_t num_classes_;
  std::string description_;
};

enum class CifarKind { kCifar10, kCifar100 };

// Reads the records of `files` (all of one kind). Throws tandem::Error naming
// the file when it is missing, is not a whole number of records, or holds a
// label out of range.
std::shared_ptr<CifarSource> read_cifar(const std::vector<std::string>& files, CifarKind kind,
                                        const std::string& description);

struct CifarSplits {
  std::shared_ptr<CifarSource> train, test;
};

// Opens DIR, or DIR/cifar-10-batches-bin (DIR/cifar-100-binary) when DIR is
// the folder the archive was unpacked into.
CifarSplits open_cifar(const std::string& dir, CifarKind kind);

}  // namespace tandem::data
