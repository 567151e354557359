// tandem/data/transforms.h: torchvision's image transforms, by the same names
// and parameter names.
//
// Each class takes an Options struct (defaults as in torchvision) and checks
// it in its constructor, throwing tandem::Error naming the transform. Random
// transforms draw their parameters in a static get_params(rng, ...) that
// returns a plain struct, then call the deterministic operation of
// transforms_functional.h; all draws come from the SampleRng handed to
// apply(), none from torch's global generator. The draws follow torchvision's
// distributions, not its random stream: the same (seed, epoch, index) always
// gives the same image, but not the image torchvision would give.
//
// describe() prints torchvision-style text (its v1 reprs), e.g.
// "RandomCrop(size=(32, 32), padding=4)".
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/transform.h"
#include "tandem/data/transforms_functional.h"

namespace tandem::data {

// ---- deterministic -------------------------------------------------------

class Resize : public Transform {
 public:
  explicit Resize(ResizeOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  ResizeOptions options_;
};

struct CenterCropOptions {
  std::vector<int64_t> size;  // {edge} or {height, width}
};

class CenterCrop : public Transform {
 public:
  explicit CenterCrop(CenterCropOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;

 private:
  std::vector<int64_t> size_;  // {height, width}
};

// uint8 -> float32 / 255.
class ToTensor : public Transform {
 public:
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override { return "ToTensor()"; }
};

struct NormalizeOptions {
  std::vector<double> mean;
  std::vector<double> std;
};

class Normalize : public Transform {
 public:
  explicit Normalize(NormalizeOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  const NormalizeOptions& options() const { return options_; }

 private:
  NormalizeOptions options_;
  torch::Tensor mean_, std_;  // float32 [C or 1, 1, 1]
};

// ---- random crops ----------------------------------------------------------

struct RandomCropOptions {
  std::vector<int64_t> size;     // {edge} or {height, width}
  std::vector<int64_t> padding;  // none, or 1, 2 or 4 values (left, top, right, bottom)
  bool pad_if_needed = false;    // pad both sides of an edge shorter than the crop
  std::vector<double> fill = {0};
  PaddingMode padding_mode = PaddingMode::kConstant;
};

struct RandomCropParams {
  std::array<int64_t, 4> padding = {0, 0, 0, 0};  // left, top, right, bottom
  CropBox box;                                     // in the padded image
};

class RandomCrop : public Transform {
 public:
  explicit RandomCrop(RandomCropOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  // Throws when the crop is larger than the padded image.
  static RandomCropParams get_params(SampleRng& rng, int64_t height, int64_t width,
                                     const RandomCropOptions& options);

 private:
  RandomCropOptions options_;  // size as {height, width}, padding as 4 values or none
};

struct RandomResizedCropOptions {
  std::vector<int64_t> size;  // {edge} or {height, width}
  std::array<double, 2> scale = {0.08, 1.0};
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  InterpolationMode interpolation = InterpolationMode::kBilinear;
  bool antialias = true;
};

class RandomResizedCrop : public Transform, public CropFirst {
 public:
  explicit RandomResizedCrop(RandomResizedCropOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  CropBox choose_box(int64_t height, int64_t width, SampleRng& rng) const override;
  torch::Tensor after_crop(const torch::Tensor& cropped, SampleRng& rng) const override;
  // torchvision's draw: up to 10 tries of an area fraction uniform in
  // `scale` and an aspect ratio log-uniform in `ratio`; the first box that
  // fits is placed uniformly. Otherwise the central crop with the ratio
  // clamped into `ratio` (the whole image if its ratio is inside).
  static CropBox get_params(SampleRng& rng, int64_t height, int64_t width,
                            const std::array<double, 2>& scale,
                            const std::array<double, 2>& ratio);

 private:
  RandomResizedCropOptions options_;
};

// ---- flips -----------------------------------------------------------------

struct FlipOptions {
  double p = 0.5;
};

struct FlipParams {
  bool flip = false;
};

class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(FlipOptions options = {});
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  static FlipParams get_params(SampleRng& rng, double p);

 private:
  double p_;
};

class RandomVerticalFlip : public Transform {
 public:
  explicit RandomVerticalFlip(FlipOptions options = {});
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  static FlipParams get_params(SampleRng& rng, double p);

 private:
  double p_;
};

// ---- rotation and affine ----------------------------------------------------

struct RandomRotationOptions {
  std::vector<double> degrees;  // {d}: [-d, d]; {min, max}
  InterpolationMode interpolation = InterpolationMode::kNearest;
  bool expand = false;
  std::optional<std::array<double, 2>> center;  // (x, y); none: image centre
  // One value or one per channel; empty is torchvision's fill=None (which
  // differs from 0 in bilinear mode at the border).
  std::vector<double> fill = {0};
};

struct RotationParams {
  double angle = 0;
};

class RandomRotation : public Transform, public PackedWarp {
 public:
  explicit RandomRotation(RandomRotationOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  bool warps_packed(int64_t channels) const override;
  torch::Tensor apply_packed(const torch::Tensor& packed, SampleRng& rng) const override;
  static RotationParams get_params(SampleRng& rng, const std::array<double, 2>& degrees);

 private:
  RandomRotationOptions options_;
  std::array<double, 2> degrees_;
};

struct RandomAffineOptions {
  std::vector<double> degrees;  // {d}: [-d, d]; {min, max}
  // Maximum translation as a fraction of the width and height, each in [0, 1].
  std::optional<std::array<double, 2>> translate;
  std::optional<std::array<double, 2>> scale;  // (min, max), > 0
  // Empty: none; {s}: x in [-s, s]; {min, max}: x; {xmin, xmax, ymin, ymax}.
  std::vector<double> shear;
  InterpolationMode interpolation = InterpolationMode::kNearest;
  std::vector<double> fill = {0};  // as RandomRotationOptions::fill
  std::optional<std::array<double, 2>> center;
};

class RandomAffine : public Transform, public PackedWarp {
 public:
  explicit RandomAffine(RandomAffineOptions options);
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  bool warps_packed(int64_t channels) const override;
  torch::Tensor apply_packed(const torch::Tensor& packed, SampleRng& rng) const override;
  // Angle, translation (whole pixels), scale and shear drawn uniformly from
  // the ranges in `options`.
  static AffineParams get_params(SampleRng& rng, int64_t height, int64_t width,
                                 const RandomAffineOptions& options);

 private:
  RandomAffineOptions options_;  // degrees as {min, max}, shear as {} or 4 values
};

// ---- colour ----------------------------------------------------------------

struct ColorJitterOptions {
  // Each: empty or {0}: no change; {v}: factor uniform in
  // [max(0, 1 - v), 1 + v] (hue: [-v, v], v <= 0.5); {min, max}.
  std::vector<double> brightness, contrast, saturation, hue;
};

struct ColorJitterParams {
  std::array<int, 4> order = {0, 1, 2, 3};  // 0 brightness, 1 contrast, 2 saturation, 3 hue
  std::optional<double> brightness_factor, contrast_factor, saturation_factor, hue_factor;
};

class ColorJitter : public Transform {
 public:
  explicit ColorJitter(ColorJitterOptions options = {});
  torch::Tensor apply(const torch::Tensor& image, SampleRng& rng) const override;
  std::string describe() const override;
  // With no ranges it changes nothing and draws nothing.
  bool is_identity() const override { return !brightness_ && !contrast_ && !saturation_ && !hue_; }
  // A random order of the four adjustments and a factor for each range given.
  static ColorJitterParams get_params(SampleRng& rng,
                                      const std::optional<std::array<double, 2>>& brightness,
                                      const std::optional<std::array<double, 2>>& contrast,
                                      const std::optional<std::array<double, 2>>& saturation,
                                      const std::optional<std::array<double, 2>>& hue);

 private:
  std::optional<std::array<double, 2>> brightness_, contrast_, saturation_, hue_;
};

}  // namespace tandem::data
