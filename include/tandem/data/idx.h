// tandem/data/idx.h: the IDX format of MNIST and Fashion-MNIST.
//
// Layout (big-endian): 0x00 0x00 <type> <ndims>, ndims 32-bit sizes, then the
// data. Only type 0x08 (unsigned byte) is used by these data sets. Files may be
// plain or gzip-compressed; both are read through zlib. See docs/DATA.md.
#pragma once

#include <string>

#include <torch/types.h>

#include "tandem/data/dataset.h"
#include "tandem/data/image_dataset.h"

namespace tandem::data {

// Reads one IDX file of unsigned bytes with `expected_dims` dimensions into a
// uint8 tensor. Throws tandem::Error naming `path` when the file is missing,
// has the wrong magic number or dimension count, is truncated, or has bytes
// past the data.
torch::Tensor read_idx(const std::string& path, int64_t expected_dims);

// Images [N, H, W] uint8 and labels [N] uint8, normalised on the fly with
// (x / 255 - mean) / std.
class IdxDataset : public Dataset {
 public:
  IdxDataset(torch::Tensor images, torch::Tensor labels, double mean, double std,
             std::string description);

  int64_t size() const override { return images_.size(0); }
  DatasetInfo info() const override;
  Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::string describe() const override { return description_; }

  const torch::Tensor& images() const { return images_; }
  const torch::Tensor& labels() const { return labels_; }
  double mean() const { return mean_; }
  double std() const { return std_; }
  uint32_t content_digest() const override;

 private:
  torch::Tensor images_, labels_;
  double mean_, std_;
  int64_t num_classes_;
  std::string description_;
};

// The same images as raw samples (uint8 [1, H, W]) for transform pipelines.
class IdxSource : public ImageSource {
 public:
  explicit IdxSource(std::shared_ptr<const IdxDataset> data) : data_(std::move(data)) {}
  int64_t size() const override { return data_->size(); }
  int64_t num_classes() const override { return data_->info().num_classes; }
  torch::Tensor image(int64_t index) const override { return data_->images()[index].unsqueeze(0); }
  int64_t label(int64_t index) const override { return data_->labels()[index].item<int64_t>(); }
  std::string name(int64_t index) const override;
  std::string describe() const override { return data_->describe(); }
  uint32_t content_digest() const override { return data_->content_digest(); }

 private:
  std::shared_ptr<const IdxDataset> data_;
};

// Opens DIR/{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]. Both splits are
// normalised with the training images' mean and standard deviation.
DataSplits open_idx(const std::string& dir);

// The test split of DIR alone (t10k-*; no training files needed), normalised
// with another set's training statistics: --val-data idx:DIR.
std::shared_ptr<const IdxDataset> open_idx_test(const std::string& dir, double mean, double std);

}  // namespace tandem::data
