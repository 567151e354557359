// tandem/data/dataset.h: the dataset interface every format implements.
//
// A dataset is a random-access collection of labelled images (or of token
// windows, data/tokens.h). The loader asks
// for whole batches by index so that in-memory formats (IDX, CIFAR) can gather
// with one index_select, while per-file formats (ImageFolder) decode sample by
// sample. Contract: get_batch() is const and may be called from several
// loader threads at once; the result depends only on (indices, epoch), which
// is what makes runs reproducible whatever the number of workers or ranks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace tandem::data {

struct Batch {
  torch::Tensor inputs;   // [B, C, H, W] float32; token data: [B, T] int64 token ids
  torch::Tensor targets;  // [B] int64 class indices; token data: [B, T] the next tokens
  int64_t size() const { return targets.defined() ? targets.size(0) : 0; }
};

struct DatasetInfo {
  int64_t channels = 0;
  int64_t height = 0;
  int64_t width = 0;
  int64_t num_classes = 0;  // token data: the vocabulary
  // The name of each class index where the data names them (an ImageFolder's
  // class folders), else empty.
  std::vector<std::string> class_names;
  int64_t seq_len = 0;  // token data: the tokens of a sample (0: images)
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual DatasetInfo info() const = 0;
  // The samples at `indices`, in that order. `epoch` seeds random transforms.
  virtual Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch) const = 0;
  // One line for logs, e.g. "idx:/usr/share/datasets/fashion-mnist train (60000 images)".
  virtual std::string describe() const = 0;
  // Warnings gathered since the last call (e.g. images skipped as unreadable),
  // one line each; the trainer prints them. Thread-safe.
  virtual std::vector<std::string> drain_warnings() const { return {}; }
  // A digest of the labels in order, the class names and, where the images
  // are in memory (IDX, CIFAR), their bytes (Note [content digest] in
  // src/data/image_dataset.cpp): two data sets of one size (MNIST and
  // Fashion-MNIST, another copy of a folder) differ in it, whatever their
  // paths. 0 where the data set does not say.
  virtual uint32_t content_digest() const { return 0; }
};

// The content digest of `labels` (a 1-d tensor of class indices, in order),
// `class_names` and `images` (uint8, any shape; undefined where the images
// are not in memory).
uint32_t content_digest(const torch::Tensor& labels, const std::vector<std::string>& class_names,
                        const torch::Tensor& images = {});

// A training and an evaluation split of one data source.
struct DataSplits {
  std::shared_ptr<const Dataset> train;
  std::shared_ptr<const Dataset> test;
  // The format's defaults, what an empty --augment and --image-size 0 stand
  // for (idx: none and the files' own height; cifar: cifar and 32;
  // imagefolder: imagenet and 224), so that a value given explicitly can be
  // told to mean the default (a checkpoint's fingerprint).
  std::string default_augment;
  int64_t default_image_size = 0;
  // The per-channel mean and standard deviation the inputs are normalised
  // with: the preset's fixed statistics (cifar10, cifar100, imagefolder), or
  // for IDX the training images' own, which normalise its test split and any
  // --val-data IDX set too. Exports record them (Note [normalisation in
  // exports] in src/engine/run_weights.cpp).
  std::vector<double> mean, std;
  // What the evaluation split's samples go through, in torchvision's words
  // (Transform::describe): exports record it, and `tandem eval` checks it.
  std::string eval_transform;
};

// Throws tandem::Error "KIND:DIR: no such directory" (or "not a
// directory"): the readers' first check, and a launcher's before its
// workers start (check_spec_folder). Defined in image_dataset.cpp.
void check_data_folder(const std::string& kind, const std::string& dir);

}  // namespace tandem::data
