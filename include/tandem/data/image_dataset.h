// tandem/data/image_dataset.h: images read one at a time, then transformed.
//
// An ImageSource yields raw samples (uint8 [C, H, W] and a label): CIFAR
// records in memory, ImageFolder files on disk, IDX images. A
// TransformedDataset runs each sample through a transform pipeline with a
// SampleRng seeded by (seed, epoch, index) and stacks the results into a
// batch, so the batch for a given (indices, epoch) is the same whichever
// loader thread, process or rank builds it.
//
// Bad images: an ImageError from the source stops the run, unless
// skip_bad_images is set; then the sample is left out of its batch (which
// becomes smaller, possibly empty) and the file is reported once through
// drain_warnings().
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/image_io.h"
#include "tandem/data/transform.h"

namespace tandem::data {

class ImageSource {
 public:
  virtual ~ImageSource() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  // The name of each class index, where the source has names; else empty.
  virtual std::vector<std::string> class_names() const { return {}; }
  // uint8 [C, H, W]; throws ImageError naming the file for an unreadable image.
  // Called from several loader threads at once.
  virtual torch::Tensor image(int64_t index) const = 0;
  virtual int64_t label(int64_t index) const = 0;
  // Where sample `index` comes from, for messages (a path, or a record).
  virtual std::string name(int64_t index) const = 0;
  // The pixels of one box of image `index`, the box chosen by `choose` from
  // the image's (height, width) and inside the image (Note [decoding only
  // the crop]). The default decodes the whole image and slices it.
  virtual torch::Tensor image_box(int64_t index, const BoxChooser& choose) const;
  // e.g. "cifar10:/data/cifar train (50000 images)".
  virtual std::string describe() const = 0;
  // Dataset::content_digest() of these samples; the default asks label()
  // for each.
  virtual uint32_t content_digest() const;
};

struct TransformedDatasetOptions {
  uint64_t seed = 0;             // with (epoch, index), seeds each sample's transforms
  bool skip_bad_images = false;  // leave unreadable images out instead of failing
};

class TransformedDataset : public Dataset {
 public:
  TransformedDataset(std::shared_ptr<const ImageSource> source, TransformPtr transform,
                     TransformedDatasetOptions options);

  int64_t size() const override { return source_->size(); }
  // Channels and size of the transformed first sample (decoded once, at
  // construction, which also checks that the pipeline ends in float CHW).
  DatasetInfo info() const override { return info_; }
  Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::string describe() const override;
  std::vector<std::string> drain_warnings() const override;
  uint32_t content_digest() const override { return source_->content_digest(); }

  // One sample, transformed for `epoch` (no skipping). Given `into` (e.g. a
  // row of a batch), the pipeline may write its result there
  // (Compose::apply_into); the result is returned either way.
  torch::Tensor sample(int64_t index, int64_t epoch, const torch::Tensor& into = {}) const;
  // The same through the source's full image, never a partial decode (for
  // tests of Note [decoding only the crop]).
  torch::Tensor sample_whole(int64_t index, int64_t epoch) const;
  // Whether sample() asks the source for the first transform's crop only.
  bool crops_first() const { return crop_first_ != nullptr; }
  const Transform& transform() const { return *transform_; }
  // Images left out so far (skip_bad_images).
  int64_t skipped() const { return skipped_.load(); }

 private:
  std::shared_ptr<const ImageSource> source_;
  TransformPtr transform_;
  const CropFirst* crop_first_ = nullptr;  // the first transform, if it crops first
  std::unique_ptr<Compose> rest_;          // the transforms after it
  TransformedDatasetOptions options_;
  DatasetInfo info_;
  mutable std::atomic<int64_t> skipped_{0};
  mutable std::mutex mutex_;               // guards the two below
  mutable std::set<int64_t> reported_;     // indices already warned about
  mutable std::vector<std::string> warnings_;
};

}  // namespace tandem::data
