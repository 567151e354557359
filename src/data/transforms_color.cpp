// The colour operations of transforms_functional.h (torchvision v2's
// _color.py on tensors, op for op), to_tensor and normalize, and the
// transforms built on them: ColorJitter, ToTensor, Normalize.
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <utility>

#include "tandem/data/transforms.h"
#include "tandem/util/check.h"
#include "transforms_internal.h"

namespace tandem::data {
namespace functional {
namespace {

using detail::check_color_image;
using detail::py_float;

double max_value(const torch::Tensor& image) {
  return image.scalar_type() == torch::kUInt8 ? 255.0 : 1.0;
}

// 0.2989 R + 0.587 G + 0.114 B as float32 [1, H, W].
torch::Tensor grayscale(const torch::Tensor& image) {
  auto rgb = image.unbind(0);
  return rgb[0].mul(0.2989).add_(rgb[1], 0.587).add_(rgb[2], 0.114).unsqueeze(0);
}

// ratio * image1 + (1 - ratio) * image2, clamped to the dtype's range.
torch::Tensor blend(const torch::Tensor& image1, const torch::Tensor& image2, double ratio) {
  auto out = image1.mul(ratio).add_(image2, 1.0 - ratio).clamp_(0, max_value(image1));
  return image1.is_floating_point() ? out : detail::float_to_uint8(out);
}

void check_factor(double factor, const char* who, const char* name) {
  TANDEM_CHECK(factor >= 0, who, ": ", name, " must be >= 0, got ", py_float(factor));
}

// RGB in [0, 1] -> HSV, as torchvision (after Pillow's Convert.c).
torch::Tensor rgb_to_hsv(const torch::Tensor& image) {
  auto channels = image.unbind(0);
  const auto& r = channels[0];
  const auto& g = channels[1];
  auto [minc, maxc] = torch::aminmax(image, 0);
  auto eqc = maxc == minc;
  auto channels_range = maxc - minc;
  auto ones = torch::ones_like(maxc);
  auto s = channels_range / torch::where(eqc, ones, maxc);
  auto divisor = torch::where(eqc, ones, channels_range).unsqueeze_(0);
  auto rgb_c = ((maxc.unsqueeze(0) - image) / divisor).unbind(0);
  auto rc = rgb_c[0], gc = rgb_c[1], bc = rgb_c[2];
  auto maxc_neq_r = maxc != r;
  auto maxc_eq_g = maxc == g;
  // The in-place steps below run in torchvision's order; they share buffers.
  auto hg = rc.add(2.0).sub_(bc).mul_(maxc_eq_g & maxc_neq_r);
  auto hr = bc.sub_(gc).mul_(~maxc_neq_r);
  auto hb = gc.add_(4.0).sub_(rc).mul_(maxc_neq_r.logical_and_(maxc_eq_g.logical_not_()));
  auto h = hr.add_(hg).add_(hb);
  h = h.mul_(1.0 / 6.0).add_(1.0).fmod_(1.0);
  return torch::stack({h, s, maxc}, 0);
}

torch::Tensor hsv_to_rgb(const torch::Tensor& hsv) {
  auto channels = hsv.unbind(0);
  const auto& h = channels[0];
  const auto& s = channels[1];
  const auto& v = channels[2];
  auto h6 = h.mul(6);
  auto i = torch::floor(h6);
  auto f = h6.sub_(i);
  auto sector = i.to(torch::kInt32);
  auto sxf = s * f;
  auto one_minus_s = torch::rsub(s, 1.0);
  auto q = torch::rsub(sxf, 1.0).mul_(v).clamp_(0.0, 1.0);
  auto t = sxf.add_(one_minus_s).mul_(v).clamp_(0.0, 1.0);
  auto p = one_minus_s.mul_(v).clamp_(0.0, 1.0);
  sector.remainder_(6);
  auto vpqt = torch::stack({v, p, q, t}, 0);
  // For each sector, which of (v, p, q, t) becomes r, g and b.
  static const auto select_table =
      torch::tensor({0, 2, 1, 1, 3, 0, 3, 0, 0, 2, 1, 1, 1, 1, 3, 0, 0, 2}, torch::kInt64)
          .view({3, 6});
  auto select = select_table.index_select(1, sector.flatten()).view({3, h.size(0), h.size(1)});
  return vpqt.gather(0, select);
}

}  // namespace

torch::Tensor adjust_brightness(const torch::Tensor& image, double brightness_factor) {
  check_color_image(image, "adjust_brightness");
  check_factor(brightness_factor, "adjust_brightness", "brightness_factor");
  auto out = image.mul(brightness_factor).clamp_(0, max_value(image));
  return image.is_floating_point() ? out : detail::float_to_uint8(out);
}

torch::Tensor adjust_contrast(const torch::Tensor& image, double contrast_factor) {
  check_color_image(image, "adjust_contrast");
  check_factor(contrast_factor, "adjust_contrast", "contrast_factor");
  bool fp = image.is_floating_point();
  torch::Tensor gray;
  if (image.size(0) == 3) {
    gray = grayscale(image);
    if (!fp) gray.floor_();
  } else {
    gray = fp ? image : image.to(torch::kFloat32);
  }
  auto mean = torch::mean(gray, {-3, -2, -1}, /*keepdim=*/true);
  return blend(image, mean, contrast_factor);
}

torch::Tensor adjust_saturation(const torch::Tensor& image, double saturation_factor) {
  check_color_image(image, "adjust_saturation");
  check_factor(saturation_factor, "adjust_saturation", "saturation_factor");
  if (image.size(0) == 1) return image;  // as PIL: grey stays grey
  auto gray = grayscale(image);
  if (!image.is_floating_point()) gray.floor_();
  return blend(image, gray, saturation_factor);
}

torch::Tensor adjust_hue(const torch::Tensor& image, double hue_factor) {
  check_color_image(image, "adjust_hue");
  TANDEM_CHECK(hue_factor >= -0.5 && hue_factor <= 0.5,
               "adjust_hue: hue_factor must be in [-0.5, 0.5], got ", py_float(hue_factor));
  if (image.size(0) == 1 || image.numel() == 0) return image;  // grey has no hue
  bool fp = image.is_floating_point();
  auto x = fp ? image : image.to(torch::kFloat32).mul_(1.0 / 255);
  auto hsv = rgb_to_hsv(x);
  auto channels = hsv.unbind(0);
  channels[0].add_(hue_factor).remainder_(1.0);
  auto rgb = hsv_to_rgb(torch::stack(channels, 0));
  // torchvision's float -> uint8: scale by 256 - 1e-3 and truncate.
  return fp ? rgb : detail::float_to_uint8(rgb.mul(255 + 1.0 - 1e-3));
}

torch::Tensor to_tensor(const torch::Tensor& image) {
  detail::check_image(image, "ToTensor");
  TANDEM_CHECK(image.scalar_type() == torch::kUInt8, "ToTensor: expected a uint8 image, got ",
               image.scalar_type(), " (is ToTensor applied twice?)");
  // torchvision's to(float32).div(255): an exact cast, then the division in
  // place (the cast and the division fused in one TensorIterator pass,
  // at::div_out from uint8, is slower: 58 against 39 us at 224 px).
  //
  // Into a contiguous [C, H, W] tensor, as torchvision's to_tensor (which
  // permutes HWC to CHW and calls contiguous()), whatever the input's memory
  // order: decoded and resized images are channels-last views, and a
  // channels-last float image made Normalize's per-channel broadcast run
  // over an innermost dimension of 3 (400 to 600 us at 224 px instead of
  // about 45) and the batch's stack a permuting copy (about 110 us a
  // sample). Reading the channels-last bytes here costs about 110 us
  // instead of 45.
  auto out = torch::empty(image.sizes(), image.options().dtype(torch::kFloat32));
  out.copy_(image);
  return out.div_(255);
}

torch::Tensor normalize(const torch::Tensor& image, const std::vector<double>& mean,
                        const std::vector<double>& std) {
  SampleRng unused(0, 0, 0);
  return Normalize({mean, std}).apply(image, unused);
}

}  // namespace functional

// ---- ToTensor, Normalize ------------------------------------------------------

torch::Tensor ToTensor::apply(const torch::Tensor& image, SampleRng& /*rng*/) const {
  return functional::to_tensor(image);
}

Normalize::Normalize(NormalizeOptions options) : options_(std::move(options)) {
  TANDEM_CHECK(!options_.mean.empty() && options_.mean.size() == options_.std.size(),
               "Normalize: mean and std must have the same, non-zero number of values, got ",
               options_.mean.size(), " and ", options_.std.size());
  for (double s : options_.std) {
    TANDEM_CHECK(s != 0, "Normalize: std must not be 0, got ", detail::py_list(options_.std));
  }
  mean_ = torch::tensor(options_.mean, torch::kFloat32).view({-1, 1, 1});
  std_ = torch::tensor(options_.std, torch::kFloat32).view({-1, 1, 1});
}

torch::Tensor Normalize::apply(const torch::Tensor& image, SampleRng& /*rng*/) const {
  detail::check_image(image, "Normalize");
  TANDEM_CHECK(image.scalar_type() == torch::kFloat32,
               "Normalize: expected a float32 image (apply ToTensor first), got ",
               image.scalar_type());
  int64_t n = mean_.size(0);
  TANDEM_CHECK(n == 1 || n == image.size(0), "Normalize: mean and std have ", n,
               " values but the image has ", image.size(0), " channels");
  return image.sub(mean_).div_(std_);
}

std::string Normalize::describe() const {
  return "Normalize(mean=" + detail::py_list(options_.mean) +
         ", std=" + detail::py_list(options_.std) + ")";
}

// ---- ColorJitter -----------------------------------------------------------------

namespace {

// torchvision's ColorJitter._check_input: a range, or none for the identity.
std::optional<std::array<double, 2>> jitter_range(const std::vector<double>& value,
                                                  const char* name, double center,
                                                  std::array<double, 2> bound,
                                                  bool clip_first_on_zero) {
  if (value.empty()) return std::nullopt;
  std::array<double, 2> range;
  if (value.size() == 1) {
    TANDEM_CHECK(value[0] >= 0, "ColorJitter: a single ", name, " value must be >= 0, got ",
                 detail::py_float(value[0]));
    range = {center - value[0], center + value[0]};
    if (clip_first_on_zero) range[0] = std::max(range[0], 0.0);
  } else {
    TANDEM_CHECK(value.size() == 2, "ColorJitter: ", name,
                 " must be one value or (min, max), got ", value.size(), " values");
    range = {value[0], value[1]};
  }
  TANDEM_CHECK(bound[0] <= range[0] && range[0] <= range[1] && range[1] <= bound[1],
               "ColorJitter: ", name, " must lie in [", detail::py_float(bound[0]), ", ",
               detail::py_float(bound[1]), "] as (min, max) with min <= max, got ",
               detail::py_tuple(range));
  if (range[0] == center && range[1] == center) return std::nullopt;
  return range;
}

std::string range_text(const std::optional<std::array<double, 2>>& range) {
  return range ? detail::py_tuple(*range) : "None";
}

}  // namespace

ColorJitter::ColorJitter(ColorJitterOptions options)
    : brightness_(jitter_range(options.brightness, "brightness", 1.0,
                               {0.0, std::numeric_limits<double>::infinity()}, true)),
      contrast_(jitter_range(options.contrast, "contrast", 1.0,
                             {0.0, std::numeric_limits<double>::infinity()}, true)),
      saturation_(jitter_range(options.saturation, "saturation", 1.0,
                               {0.0, std::numeric_limits<double>::infinity()}, true)),
      hue_(jitter_range(options.hue, "hue", 0.0, {-0.5, 0.5}, false)) {}

ColorJitterParams ColorJitter::get_params(SampleRng& rng,
                                          const std::optional<std::array<double, 2>>& brightness,
                                          const std::optional<std::array<double, 2>>& contrast,
                                          const std::optional<std::array<double, 2>>& saturation,
                                          const std::optional<std::array<double, 2>>& hue) {
  ColorJitterParams params;
  for (int i = 3; i > 0; --i) std::swap(params.order[i], params.order[rng.randint(0, i)]);
  auto draw = [&rng](const std::optional<std::array<double, 2>>& range) -> std::optional<double> {
    if (!range) return std::nullopt;
    return rng.uniform((*range)[0], (*range)[1]);
  };
  params.brightness_factor = draw(brightness);
  params.contrast_factor = draw(contrast);
  params.saturation_factor = draw(saturation);
  params.hue_factor = draw(hue);
  return params;
}

torch::Tensor ColorJitter::apply(const torch::Tensor& image, SampleRng& rng) const {
  if (!brightness_ && !contrast_ && !saturation_ && !hue_) return image;
  auto params = get_params(rng, brightness_, contrast_, saturation_, hue_);
  auto out = image;
  for (int id : params.order) {
    if (id == 0 && params.brightness_factor) {
      out = functional::adjust_brightness(out, *params.brightness_factor);
    } else if (id == 1 && params.contrast_factor) {
      out = functional::adjust_contrast(out, *params.contrast_factor);
    } else if (id == 2 && params.saturation_factor) {
      out = functional::adjust_saturation(out, *params.saturation_factor);
    } else if (id == 3 && params.hue_factor) {
      out = functional::adjust_hue(out, *params.hue_factor);
    }
  }
  return out;
}

std::string ColorJitter::describe() const {
  return "ColorJitter(brightness=" + range_text(brightness_) + ", contrast=" +
         range_text(contrast_) + ", saturation=" + range_text(saturation_) +
         ", hue=" + range_text(hue_) + ")";
}

}  // namespace tandem::data
