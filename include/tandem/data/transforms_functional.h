// tandem/data/transforms_functional.h: deterministic image operations with
// torchvision's tensor semantics.
//
// Each function follows torchvision.transforms.v2.functional on a plain
// tensor image [C, H, W] (uint8 or float32) and, on the same machine and
// libtorch, returns the same values bit for bit (tests/data/transforms_test.cpp
// checks this against torchvision itself). The random transforms in
// transforms.h draw their parameters and call these.
//
// Conventions shared with torchvision:
//   - sizes are (height, width); padding lists are (left, top, right, bottom)
//     and may have 1, 2 (left/right, top/bottom) or 4 values;
//   - a result may share storage with the input (crop, center_crop and
//     resize to the same size return views or the input itself); nothing
//     writes into the input;
//   - `fill` is one value for every channel or one per channel; for rotate
//     and affine an absent fill (std::nullopt, torchvision's None) and a fill
//     of 0 differ in bilinear mode at the image border, exactly as there.
//
// Errors (wrong dtype, channel count or argument) throw tandem::Error naming
// the operation and what it expected.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

namespace tandem::data {

enum class InterpolationMode { kNearest, kBilinear };
enum class PaddingMode { kConstant, kEdge, kReflect, kSymmetric };

// "nearest" / "bilinear"; "constant" / "edge" / "reflect" / "symmetric".
std::string to_string(InterpolationMode mode);
std::string to_string(PaddingMode mode);

struct ResizeOptions {
  // {edge}: the smaller edge becomes `edge`, keeping the aspect ratio
  // (the longer edge is truncated, as in torchvision); {height, width}.
  std::vector<int64_t> size;
  InterpolationMode interpolation = InterpolationMode::kBilinear;
  // With a one-value size: cap the longer edge at max_size.
  std::optional<int64_t> max_size;
  // Only bilinear uses it; nearest ignores it, as in torchvision.
  bool antialias = true;
};

// The parameters of one affine map; angles in degrees, clockwise as in
// torchvision (rotate's angle is counter-clockwise).
struct AffineParams {
  double angle = 0;
  std::array<double, 2> translate = {0, 0};  // pixels, (x, y)
  double scale = 1;
  std::array<double, 2> shear = {0, 0};  // degrees, (x, y)
};

struct GridOptions {
  InterpolationMode interpolation = InterpolationMode::kNearest;
  std::optional<std::vector<double>> fill;    // none: torchvision's fill=None
  std::optional<std::array<double, 2>> center;  // (x, y) pixels; none: image centre
  bool expand = false;  // rotate only: grow the canvas to hold the whole image
};

namespace functional {

// Output (height, width) of resize for an image of in_height x in_width.
std::array<int64_t, 2> resized_size(int64_t in_height, int64_t in_width,
                                    const ResizeOptions& options);

torch::Tensor resize(const torch::Tensor& image, const ResizeOptions& options);

// A window of the image; parts outside it are zero (torchvision's crop).
torch::Tensor crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height,
                   int64_t width);

// size: {edge} or {height, width}. A crop larger than the image pads with 0.
torch::Tensor center_crop(const torch::Tensor& image, const std::vector<int64_t>& size);

// padding: 1, 2 or 4 non-negative values (see above). fill only applies to
// kConstant; a per-channel fill requires kConstant.
torch::Tensor pad(const torch::Tensor& image, const std::vector<int64_t>& padding,
                  const std::vector<double>& fill = {0},
                  PaddingMode padding_mode = PaddingMode::kConstant);

torch::Tensor hflip(const torch::Tensor& image);
torch::Tensor vflip(const torch::Tensor& image);

// Counter-clockwise by `angle` degrees; uses options.expand.
torch::Tensor rotate(const torch::Tensor& image, double angle, const GridOptions& options = {});

// Ignores options.expand (the output keeps the input size).
torch::Tensor affine(const torch::Tensor& image, const AffineParams& params,
                     const GridOptions& options = {});

// Colour adjustments need 1 or 3 channels. Factors are >= 0; 1 is the
// identity. Hue is in [-0.5, 0.5] and leaves 1-channel images unchanged
// (as torchvision and PIL do: grey has no hue).
torch::Tensor adjust_brightness(const torch::Tensor& image, double brightness_factor);
torch::Tensor adjust_contrast(const torch::Tensor& image, double contrast_factor);
torch::Tensor adjust_saturation(const torch::Tensor& image, double saturation_factor);
torch::Tensor adjust_hue(const torch::Tensor& image, double hue_factor);

// uint8 [C, H, W] -> float32 in [0, 1] (x / 255, torchvision's to_tensor).
torch::Tensor to_tensor(const torch::Tensor& image);

// (x - mean) / std per channel on a float image; mean and std have one value
// per channel or one for all.
torch::Tensor normalize(const torch::Tensor& image, const std::vector<double>& mean,
                        const std::vector<double>& std);

}  // namespace functional
}  // namespace tandem::data
