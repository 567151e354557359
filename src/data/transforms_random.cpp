// The geometric transforms of transforms.h: option checks, parameter draws
// (torchvision v2's make_params, on a SampleRng) and describe().
#include <torch/torch.h>

#include <cmath>
#include <utility>

#include "tandem/data/transforms.h"
#include "tandem/util/check.h"
#include "transforms_internal.h"

namespace tandem::data {

using detail::py_float;
using detail::py_number;

namespace {

std::vector<int64_t> as_vector(const std::array<int64_t, 2>& size) { return {size[0], size[1]}; }

// An empty fill is torchvision's fill=None.
std::optional<std::vector<double>> fill_or_none(const std::vector<double>& fill) {
  if (fill.empty()) return std::nullopt;
  return fill;
}

// Note [packed warp chains]: a warp runs on packed pixels when it is
// nearest-neighbour and its fill is none or zeros, of a size apply() would
// accept for the image (otherwise apply() runs and reports the fill).
bool zero_fill_for(const std::vector<double>& fill, int64_t channels) {
  if (fill.size() > 1 && static_cast<int64_t>(fill.size()) != channels) return false;
  return detail::all_zero(fill);
}

std::string fill_or_none_text(const std::vector<double>& fill) {
  return fill.empty() ? "None" : detail::fill_text(fill);
}

bool is_zero_fill(const std::vector<double>& fill) {
  for (double v : fill) {
    if (v != 0.0) return false;
  }
  return true;
}

}  // namespace

// ---- Resize, CenterCrop ----------------------------------------------------------

Resize::Resize(ResizeOptions options) : options_(std::move(options)) {
  functional::resized_size(1, 1, options_);  // checks size and max_size
  TANDEM_CHECK(!options_.max_size || options_.size.size() == 1,
               "Resize: max_size needs a one-value size (the smaller edge)");
}

torch::Tensor Resize::apply(const torch::Tensor& image, SampleRng& /*rng*/) const {
  return functional::resize(image, options_);
}

std::string Resize::describe() const {
  std::string size = options_.size.size() == 1
                         ? std::to_string(options_.size[0])
                         : detail::size_text({options_.size[0], options_.size[1]});
  return "Resize(size=" + size + ", interpolation=" + to_string(options_.interpolation) +
         ", max_size=" + (options_.max_size ? std::to_string(*options_.max_size) : "None") +
         ", antialias=" + (options_.antialias ? "True" : "False") + ")";
}

CenterCrop::CenterCrop(CenterCropOptions options)
    : size_(as_vector(detail::parse_size(options.size, "CenterCrop"))) {}

torch::Tensor CenterCrop::apply(const torch::Tensor& image, SampleRng& /*rng*/) const {
  return functional::center_crop(image, size_);
}

std::string CenterCrop::describe() const {
  return "CenterCrop(size=" + detail::size_text({size_[0], size_[1]}) + ")";
}

// ---- RandomCrop ------------------------------------------------------------------

RandomCrop::RandomCrop(RandomCropOptions options) : options_(std::move(options)) {
  options_.size = as_vector(detail::parse_size(options_.size, "RandomCrop"));
  if (!options_.padding.empty()) detail::parse_padding(options_.padding, "RandomCrop");
  TANDEM_CHECK(options_.fill.size() <= 1 || options_.padding_mode == PaddingMode::kConstant,
               "RandomCrop: a per-channel fill needs padding_mode constant, not ",
               to_string(options_.padding_mode));
}

RandomCropParams RandomCrop::get_params(SampleRng& rng, int64_t height, int64_t width,
                                        const RandomCropOptions& options) {
  auto [crop_height, crop_width] = detail::parse_size(options.size, "RandomCrop");
  RandomCropParams params;
  auto& [left, top, right, bottom] = params.padding;
  if (!options.padding.empty()) params.padding = detail::parse_padding(options.padding, "RandomCrop");
  int64_t padded_height = height + top + bottom;
  int64_t padded_width = width + left + right;
  if (options.pad_if_needed && padded_height < crop_height) {
    int64_t diff = crop_height - padded_height;
    top += diff;
    bottom += diff;
    padded_height += 2 * diff;
  }
  if (options.pad_if_needed && padded_width < crop_width) {
    int64_t diff = crop_width - padded_width;
    left += diff;
    right += diff;
    padded_width += 2 * diff;
  }
  TANDEM_CHECK(padded_height >= crop_height && padded_width >= crop_width,
               "RandomCrop: crop size ", detail::size_text({crop_height, crop_width}),
               " is larger than the ", options.padding.empty() ? "" : "padded ", "image size ",
               detail::size_text({padded_height, padded_width}),
               " (set pad_if_needed to pad small images)");
  params.box.height = crop_height;
  params.box.width = crop_width;
  params.box.top = padded_height > crop_height ? rng.randint(0, padded_height - crop_height) : 0;
  params.box.left = padded_width > crop_width ? rng.randint(0, padded_width - crop_width) : 0;
  return params;
}

torch::Tensor RandomCrop::apply(const torch::Tensor& image, SampleRng& rng) const {
  detail::check_image(image, "RandomCrop");
  auto params = get_params(rng, image.size(1), image.size(2), options_);
  const auto& [left, top, right, bottom] = params.padding;
  const auto& box = params.box;
  if (options_.padding_mode == PaddingMode::kConstant && is_zero_fill(options_.fill)) {
    // Zero padding then cropping equals a crop that zero-fills what lies
    // outside the image, without padding the whole image first.
    return functional::crop(image, box.top - top, box.left - left, box.height, box.width);
  }
  auto out = image;
  if (left || top || right || bottom) {
    out = functional::pad(out, {left, top, right, bottom}, options_.fill, options_.padding_mode);
  }
  return functional::crop(out, box.top, box.left, box.height, box.width);
}

std::string RandomCrop::describe() const {
  std::string out = "RandomCrop(size=" + detail::size_text({options_.size[0], options_.size[1]});
  if (!options_.padding.empty()) {
    out += ", padding=" + (options_.padding.size() == 1 ? std::to_string(options_.padding[0])
                                                        : detail::py_ints(options_.padding));
  }
  if (options_.pad_if_needed) out += ", pad_if_needed=True";
  if (!is_zero_fill(options_.fill)) out += ", fill=" + detail::fill_text(options_.fill);
  if (options_.padding_mode != PaddingMode::kConstant) {
    out += ", padding_mode=" + to_string(options_.padding_mode);
  }
  return out + ")";
}

// ---- RandomResizedCrop ----------------------------------------------------------

RandomResizedCrop::RandomResizedCrop(RandomResizedCropOptions options)
    : options_(std::move(options)) {
  options_.size = as_vector(detail::parse_size(options_.size, "RandomResizedCrop"));
  const auto& [s0, s1] = options_.scale;
  const auto& [r0, r1] = options_.ratio;
  TANDEM_CHECK(0 <= s0 && s0 <= s1 && s1 > 0,
               "RandomResizedCrop: scale must be (min, max) with 0 <= min <= max, max > 0, got ",
               detail::py_tuple(options_.scale));
  TANDEM_CHECK(0 < r0 && r0 <= r1, "RandomResizedCrop: ratio must be (min, max) with 0 < min <= ",
               "max, got ", detail::py_tuple(options_.ratio));
}

CropBox RandomResizedCrop::get_params(SampleRng& rng, int64_t height, int64_t width,
                                      const std::array<double, 2>& scale,
                                      const std::array<double, 2>& ratio) {
  double area = static_cast<double>(height * width);
  double log_ratio_min = std::log(ratio[0]), log_ratio_max = std::log(ratio[1]);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target_area = area * rng.uniform(scale[0], scale[1]);
    double aspect_ratio = std::exp(rng.uniform(log_ratio_min, log_ratio_max));
    int64_t w = detail::round_half_even(std::sqrt(target_area * aspect_ratio));
    int64_t h = detail::round_half_even(std::sqrt(target_area / aspect_ratio));
    if (0 < w && w <= width && 0 < h && h <= height) {
      int64_t top = rng.randint(0, height - h);
      int64_t left = rng.randint(0, width - w);
      return {top, left, h, w};
    }
  }
  // Fallback: the central crop, its ratio clamped into `ratio`.
  double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t w = width, h = height;
  if (in_ratio < ratio[0]) {
    h = detail::round_half_even(w / ratio[0]);
  } else if (in_ratio > ratio[1]) {
    w = detail::round_half_even(h * ratio[1]);
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

torch::Tensor RandomResizedCrop::apply(const torch::Tensor& image, SampleRng& rng) const {
  detail::check_image(image, "RandomResizedCrop");
  auto box = choose_box(image.size(1), image.size(2), rng);
  return after_crop(functional::crop(image, box.top, box.left, box.height, box.width), rng);
}

CropBox RandomResizedCrop::choose_box(int64_t height, int64_t width, SampleRng& rng) const {
  return get_params(rng, height, width, options_.scale, options_.ratio);
}

torch::Tensor RandomResizedCrop::after_crop(const torch::Tensor& cropped, SampleRng& /*rng*/) const {
  ResizeOptions resize;
  resize.size = options_.size;
  resize.interpolation = options_.interpolation;
  resize.antialias = options_.antialias;
  return functional::resize(cropped, resize);
}

std::string RandomResizedCrop::describe() const {
  auto round4 = [](const std::array<double, 2>& v) {
    return std::array<double, 2>{std::round(v[0] * 1e4) / 1e4, std::round(v[1] * 1e4) / 1e4};
  };
  return "RandomResizedCrop(size=" + detail::size_text({options_.size[0], options_.size[1]}) +
         ", scale=" + detail::py_tuple(round4(options_.scale)) +
         ", ratio=" + detail::py_tuple(round4(options_.ratio)) +
         ", interpolation=" + to_string(options_.interpolation) +
         ", antialias=" + (options_.antialias ? "True" : "False") + ")";
}

// ---- flips -------------------------------------------------------------------------

namespace {
double checked_p(double p, const char* who) {
  TANDEM_CHECK(p >= 0 && p <= 1, who, ": p must be in [0, 1], got ", py_float(p));
  return p;
}
}  // namespace

RandomHorizontalFlip::RandomHorizontalFlip(FlipOptions options)
    : p_(checked_p(options.p, "RandomHorizontalFlip")) {}

FlipParams RandomHorizontalFlip::get_params(SampleRng& rng, double p) {
  return {rng.bernoulli(p)};
}

torch::Tensor RandomHorizontalFlip::apply(const torch::Tensor& image, SampleRng& rng) const {
  return get_params(rng, p_).flip ? functional::hflip(image) : image;
}

std::string RandomHorizontalFlip::describe() const {
  return "RandomHorizontalFlip(p=" + py_float(p_) + ")";
}

RandomVerticalFlip::RandomVerticalFlip(FlipOptions options)
    : p_(checked_p(options.p, "RandomVerticalFlip")) {}

FlipParams RandomVerticalFlip::get_params(SampleRng& rng, double p) { return {rng.bernoulli(p)}; }

torch::Tensor RandomVerticalFlip::apply(const torch::Tensor& image, SampleRng& rng) const {
  return get_params(rng, p_).flip ? functional::vflip(image) : image;
}

std::string RandomVerticalFlip::describe() const {
  return "RandomVerticalFlip(p=" + py_float(p_) + ")";
}

// ---- RandomRotation ------------------------------------------------------------------

RandomRotation::RandomRotation(RandomRotationOptions options)
    : options_(std::move(options)),
      degrees_(detail::parse_degrees(options_.degrees, "RandomRotation", "degrees")) {}

RotationParams RandomRotation::get_params(SampleRng& rng, const std::array<double, 2>& degrees) {
  return {rng.uniform(degrees[0], degrees[1])};
}

torch::Tensor RandomRotation::apply(const torch::Tensor& image, SampleRng& rng) const {
  GridOptions grid;
  grid.interpolation = options_.interpolation;
  grid.fill = fill_or_none(options_.fill);
  grid.center = options_.center;
  grid.expand = options_.expand;
  return functional::rotate(image, get_params(rng, degrees_).angle, grid);
}

bool RandomRotation::warps_packed(int64_t channels) const {
  return options_.interpolation == InterpolationMode::kNearest && zero_fill_for(options_.fill, channels);
}

torch::Tensor RandomRotation::apply_packed(const torch::Tensor& packed, SampleRng& rng) const {
  GridOptions grid;  // nearest, no fill: zero padding
  grid.center = options_.center;
  grid.expand = options_.expand;
  return functional::rotate(packed, get_params(rng, degrees_).angle, grid);
}

std::string RandomRotation::describe() const {
  std::string out = "RandomRotation(degrees=" + detail::py_list({degrees_[0], degrees_[1]}) +
                    ", interpolation=" + to_string(options_.interpolation) +
                    ", expand=" + (options_.expand ? "True" : "False");
  if (options_.center) out += ", center=" + detail::py_list({(*options_.center)[0], (*options_.center)[1]});
  return out + ", fill=" + fill_or_none_text(options_.fill) + ")";
}

// ---- RandomAffine -----------------------------------------------------------------------

namespace {

// Degrees as {min, max} and shear as {} (none), {min, max} (x only) or four values.
RandomAffineOptions normalized(RandomAffineOptions options) {
  auto degrees = detail::parse_degrees(options.degrees, "RandomAffine", "degrees");
  options.degrees = {degrees[0], degrees[1]};
  if (options.shear.size() == 1 || options.shear.size() == 2) {
    auto x = detail::parse_degrees(options.shear, "RandomAffine", "shear");
    options.shear = {x[0], x[1]};
  } else {
    TANDEM_CHECK(options.shear.empty() || options.shear.size() == 4,
                 "RandomAffine: shear must have 0, 1, 2 or 4 values, got ", options.shear.size());
  }
  return options;
}

}  // namespace

RandomAffine::RandomAffine(RandomAffineOptions options) : options_(normalized(std::move(options))) {
  if (options_.translate) {
    for (double t : *options_.translate) {
      TANDEM_CHECK(t >= 0 && t <= 1, "RandomAffine: translate values must be in [0, 1], got ",
                   detail::py_tuple(*options_.translate));
    }
  }
  if (options_.scale) {
    for (double s : *options_.scale) {
      TANDEM_CHECK(s > 0, "RandomAffine: scale values must be positive, got ",
                   detail::py_tuple(*options_.scale));
    }
  }
}

namespace {

AffineParams draw_affine(SampleRng& rng, int64_t height, int64_t width,
                         const RandomAffineOptions& options /* normalized */) {
  AffineParams params;
  params.angle = rng.uniform(options.degrees[0], options.degrees[1]);
  if (options.translate) {
    double max_dx = (*options.translate)[0] * width;
    double max_dy = (*options.translate)[1] * height;
    params.translate = {static_cast<double>(detail::round_half_even(rng.uniform(-max_dx, max_dx))),
                        static_cast<double>(detail::round_half_even(rng.uniform(-max_dy, max_dy)))};
  }
  if (options.scale) params.scale = rng.uniform((*options.scale)[0], (*options.scale)[1]);
  if (!options.shear.empty()) params.shear[0] = rng.uniform(options.shear[0], options.shear[1]);
  if (options.shear.size() == 4) params.shear[1] = rng.uniform(options.shear[2], options.shear[3]);
  return params;
}

}  // namespace

AffineParams RandomAffine::get_params(SampleRng& rng, int64_t height, int64_t width,
                                      const RandomAffineOptions& options) {
  return draw_affine(rng, height, width, normalized(options));
}

torch::Tensor RandomAffine::apply(const torch::Tensor& image, SampleRng& rng) const {
  detail::check_image(image, "RandomAffine");
  auto params = draw_affine(rng, image.size(1), image.size(2), options_);
  GridOptions grid;
  grid.interpolation = options_.interpolation;
  grid.fill = fill_or_none(options_.fill);
  grid.center = options_.center;
  return functional::affine(image, params, grid);
}

bool RandomAffine::warps_packed(int64_t channels) const {
  return options_.interpolation == InterpolationMode::kNearest && zero_fill_for(options_.fill, channels);
}

torch::Tensor RandomAffine::apply_packed(const torch::Tensor& packed, SampleRng& rng) const {
  detail::check_image(packed, "RandomAffine");
  auto params = draw_affine(rng, packed.size(1), packed.size(2), options_);
  GridOptions grid;  // nearest, no fill: zero padding
  grid.center = options_.center;
  return functional::affine(packed, params, grid);
}

std::string RandomAffine::describe() const {
  std::string out = "RandomAffine(degrees=" + detail::py_list(options_.degrees);
  if (options_.translate) out += ", translate=" + detail::py_tuple(*options_.translate);
  if (options_.scale) out += ", scale=" + detail::py_tuple(*options_.scale);
  if (!options_.shear.empty()) out += ", shear=" + detail::py_list(options_.shear);
  if (options_.interpolation != InterpolationMode::kNearest) {
    out += ", interpolation=" + to_string(options_.interpolation);
  }
  if (!is_zero_fill(options_.fill) || options_.fill.empty()) {
    out += ", fill=" + fill_or_none_text(options_.fill);
  }
  if (options_.center) out += ", center=" + detail::py_list({(*options_.center)[0], (*options_.center)[1]});
  return out + ")";
}

}  // namespace tandem::data
