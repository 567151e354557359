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
  // Whether apply() returns its input for every image and draws nothing
  // (ColorJitter with no ranges): Compose then skips it.
  virtual bool is_identity() const { return false; }
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

// Note [tabulated finish]: ToTensor, and Normalize after it, map each uint8
// value of channel c to one float32: (v / 255 - mean[c]) / std[c]. There are
// only 256 values per channel, so Compose computes them once, with
// ToTensor's and Normalize's own apply() on a ramp of the 256 bytes, and
// finishes an image by looking its bytes up (pixel_loops.h), in one pass
// that writes the contiguous [C, H, W] result. The values are those the two
// transforms give, since each output element depends on its input element
// alone; what is saved is their four passes over the image, each with a
// full-size temporary (and, after a packed run, the split back to uint8).
// Transforms that are identities (Transform::is_identity) may stand between
// the warps, ToTensor and Normalize. An image the table does not fit (not
// uint8, or a channel count Normalize does not take) goes through the
// transforms themselves, which report what is wrong; so does one that is not
// on the CPU (packed runs still pack it, as before).

// Applies transforms in order (runs of packable warps packed, ToTensor and
// Normalize tabulated, identities skipped; see the notes above).
class Compose : public Transform {
 public:
  explicit Compose(std::vector<TransformPtr> transforms);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  // apply(), writing the result into `into` (a contiguous float32 CPU tensor,
  // e.g. a row of a batch) where the tabulated finish makes the result and
  // it has that shape; returns the result: then `into` itself (is_same),
  // else a tensor of its own for the caller to copy or reject.
  torch::Tensor apply_into(const torch::Tensor& image, SampleRng& rng, const torch::Tensor& into) const;
  std::string describe() const override;
  const std::vector<TransformPtr>& transforms() const { return transforms_; }

 private:
  torch::Tensor run(const torch::Tensor& image, SampleRng& rng, const torch::Tensor& into) const;
  // The finish of `image` (uint8 [C, H, W], or packed pixels of C channels
  // when `packed`), in `into` if it fits, or an undefined tensor if the
  // table does not fit the image or the image is not on the CPU.
  torch::Tensor finish(const torch::Tensor& image, int64_t channels, bool packed,
                       const torch::Tensor& into) const;

  std::vector<TransformPtr> transforms_;
  std::vector<const PackedWarp*> warps_;  // per transform: itself if a PackedWarp, else null
  std::vector<bool> identity_;            // per transform: is_identity()
  // Note [tabulated finish]: transforms [finish_begin_, finish_end_) are the
  // first ToTensor and a Normalize right after it (identities between), or
  // none (finish_begin_ == npos); finish_tables_ is float32 [1 or C, 256].
  size_t finish_begin_ = std::string::npos, finish_end_ = std::string::npos;
  bool finish_last_ = false;  // only identities after the finish
  torch::Tensor finish_tables_;
};

}  // namespace tandem::data
