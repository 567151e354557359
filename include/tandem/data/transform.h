// tandem/data/transform.h: the per-sample transform interface and its RNG.
//
// An image moves through a pipeline as a torch::Tensor [C, H, W]: uint8
// before ToTensor, float32 after it (torchvision's tensor convention).
// Random transforms draw only from the SampleRng they are handed, which is
// seeded by (seed, epoch, sample index): a sample's augmentation does not
// depend on which worker thread or which rank builds it, nor on the order in
// which samples are built. Transforms are immutable after construction and
// apply() is const, so one pipeline serves every loader thread at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <torch/types.h>

namespace tandem::data {

// A small counter-based generator (SplitMix64 over a hashed key). Cheap to
// construct, so every sample gets its own.
class SampleRng {
 public:
  SampleRng(uint64_t seed, int64_t epoch, int64_t index);

  uint64_t next_u64();
  // Uniform in [lo, hi).
  double uniform(double lo, double hi);
  // Uniform integer in [lo, hi] (both inclusive); requires lo <= hi.
  int64_t randint(int64_t lo, int64_t hi);
  // True with probability p.
  bool bernoulli(double p);

 private:
  uint64_t state_;
};

class Transform {
 public:
  virtual ~Transform() = default;
  // Returns the transformed image; never modifies `image` in place.
  virtual torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const = 0;
  // torchvision-style text, e.g. "RandomCrop(size=(32, 32), padding=4)".
  virtual std::string describe() const = 0;
};

using TransformPtr = std::shared_ptr<const Transform>;

// A window (top, left, height, width) in image coordinates.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};

// Note [decoding only the crop]: a transform that begins by cropping a box
// it can choose from the image's size alone (RandomResizedCrop) also
// implements CropFirst. When such a transform comes first, TransformedDataset
// asks the source for just that box, and a JPEG source decodes only those
// rows and columns (plus a margin) instead of the whole image. For every
// image and rng state,
//   apply(image, rng) == after_crop(crop(image, choose_box(H, W, rng)), rng)
// and the partial decode yields exactly the pixels of a full decode (tested),
// so the result does not depend on which path ran.
class CropFirst {
 public:
  virtual ~CropFirst() = default;
  // The box apply() would crop from an image of this size, drawing from `rng`
  // exactly as apply() does. Always inside the image.
  virtual CropBox choose_box(int64_t height, int64_t width, SampleRng& rng) const = 0;
  // The rest of apply(), given the pixels of the box.
  virtual torch::Tensor after_crop(const torch::Tensor& cropped, SampleRng& rng) const = 0;
};

// Note [packed warp chains]: a nearest-neighbour warp with a zero fill
// (RandomRotation, RandomAffine) only moves whole pixels, so the two or
// three uint8 channels of a pixel can move as one float32 value, c0 + 256 c1
// + 65536 c2, which is exact below 2^24 (Note [packed nearest warp] in
// src/data/transforms_geometry.cpp). Compose packs a uint8 image once before
// a run of such transforms, warps the packed plane through each of them, and
// splits it once after the run: the same bytes as applying them one by one,
// with a third of the sampling work and without converting between uint8 and
// float32 around every warp. A transform takes part by implementing
// PackedWarp.
class PackedWarp {
 public:
  virtual ~PackedWarp() = default;
  // Whether apply() on a uint8 image with this many channels is a
  // nearest-neighbour warp whose fill is zero (or none) and valid for it.
  virtual bool warps_packed(int64_t channels) const = 0;
  // apply() on packed pixels, a float32 [1, H, W] image (see the note),
  // drawing from `rng` exactly as apply() does; returns packed pixels.
  virtual torch::Tensor apply_packed(const torch::Tensor& packed, SampleRng& rng) const = 0;
};

// Applies transforms in order (runs of packable warps packed, as above).
class Compose : public Transform {
 public:
  explicit Compose(std::vector<TransformPtr> transforms);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  const std::vector<TransformPtr>& transforms() const { return transforms_; }

 private:
  std::vector<TransformPtr> transforms_;
  std::vector<const PackedWarp*> warps_;  // per transform: itself if a PackedWarp, else null
};

}  // namespace tandem::data
