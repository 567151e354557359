// The geometric operations of transforms_functional.h, following
// torchvision.transforms.v2.functional (_geometry.py) step by step on
// tensors: the same libtorch kernels, in the same dtypes and the same order,
// so that results match bit for bit.
#include <ATen/Version.h>
#include <torch/torch.h>

#include <cmath>

#include "tandem/data/transforms_functional.h"
#include "tandem/util/check.h"
#include "transforms_internal.h"

namespace tandem::data::functional {
namespace {

using detail::check_image;

constexpr double kDegreesToRadians = M_PI / 180.0;  // Python's math.radians

// torchvision resizes uint8 natively only where libtorch has the vectorised
// uint8 kernel (AVX2 or AVX512); elsewhere it goes through float32 and
// rounds. The choice changes the result, so it must be the same here.
bool native_uint8_bilinear() {
  static const bool native = [] {
    auto capability = at::get_cpu_capability();
    return capability == "AVX2" || capability == "AVX512";
  }();
  return native;
}

// torchvision's inverse affine matrix (output pixel -> input pixel), the
// centre given relative to the image centre. Kept in double and in
// torchvision's order of operations.
std::array<double, 6> inverse_affine_matrix(const std::array<double, 2>& center, double angle,
                                            const std::array<double, 2>& translate, double scale,
                                            const std::array<double, 2>& shear) {
  double rot = angle * kDegreesToRadians;
  double sx = shear[0] * kDegreesToRadians;
  double sy = shear[1] * kDegreesToRadians;
  double cx = center[0], cy = center[1];
  double cos_sy = std::cos(sy);
  double tan_sx = std::tan(sx);
  double rot_minus_sy = rot - sy;
  double cx_plus_tx = cx + translate[0];
  double cy_plus_ty = cy + translate[1];
  // Rotation and shear without the scale.
  double a = std::cos(rot_minus_sy) / cos_sy;
  double b = -(a * tan_sx + std::sin(rot));
  double c = std::sin(rot_minus_sy) / cos_sy;
  double d = std::cos(rot) - c * tan_sx;
  std::array<double, 6> m = {d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0};
  m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
  m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
  return m;
}

torch::Tensor theta_of(const std::array<double, 6>& matrix) {
  return torch::tensor(std::vector<double>(matrix.begin(), matrix.end()), torch::kFloat32)
      .reshape({1, 2, 3});
}

// The canvas (width, height) that holds the whole rotated image; torchvision
// computes it in float32 tensors, truncated to 1e-4 before ceil/floor.
std::array<int64_t, 2> affine_output_size(const std::array<double, 6>& matrix, int64_t w,
                                          int64_t h) {
  double half_w = 0.5 * w, half_h = 0.5 * h;
  auto pts = torch::tensor({-half_w, -half_h, 1.0, -half_w, half_h, 1.0, half_w, half_h, 1.0,
                            half_w, -half_h, 1.0},
                           torch::kFloat32)
                 .view({4, 3});
  auto theta = theta_of(matrix).view({2, 3});
  auto new_pts = torch::matmul(pts, theta.t());
  auto [min_vals, max_vals] = new_pts.aminmax(0);
  auto halfs = torch::tensor({half_w, half_h}, torch::kFloat32);
  min_vals.add_(halfs);
  max_vals.add_(halfs);
  double tol = 1e-4;
  double inv_tol = 1.0 / tol;
  auto cmax = max_vals.mul_(inv_tol).trunc_().mul_(tol).ceil_();
  auto cmin = min_vals.mul_(inv_tol).trunc_().mul_(tol).floor_();
  auto size = cmax.sub_(cmin);
  return {static_cast<int64_t>(size[0].item<float>()), static_cast<int64_t>(size[1].item<float>())};
}

// Sampling grid [1, oh, ow, 2] in grid_sample's normalised coordinates.
//
// torchvision builds it as a [oh*ow, 3] x [3, 2] matrix product (bmm), which
// MKL runs through a slow path for this shape (2 ms, most of a rotated 224 px
// sample's time). Each grid value is x * a + y * b + c, so it is computed
// here by broadcasting, in that order, in float32, one contiguous plane per
// coordinate. The values can differ from MKL's in the last bit (MKL may fuse
// multiply-adds), which changes a nearest-neighbour pick only when a source
// coordinate lies within an ulp of a pixel boundary; the bit-exactness tests
// against torchvision (tests/data/transforms_test.cpp) pass with it.
//
// The planes are handed to grid_sampler as they are, through a permuted
// view: its CPU kernel reads a grid whose x and y lie in separate planes
// (stride 1 along the width) as it reads an interleaved one, with the same
// arithmetic, and interleaving them would be a copy of the whole grid
// (60 to 100 us at 224 px).
torch::Tensor affine_grid(torch::Tensor theta, int64_t w, int64_t h, int64_t ow, int64_t oh) {
  auto options = torch::TensorOptions().dtype(torch::kFloat32);
  auto x = torch::linspace((1.0 - ow) * 0.5, (ow - 1.0) * 0.5, ow, options).view({1, 1, ow});
  auto y = torch::linspace((1.0 - oh) * 0.5, (oh - 1.0) * 0.5, oh, options).view({1, oh, 1});
  // [3, 2]: rows multiply x, y and 1; columns give the grid's x and y.
  auto t = theta.view({2, 3}).t().div(torch::tensor({0.5 * w, 0.5 * h}, options));
  // Per plane (grid x, grid y): its multipliers of x, y and 1, as [2, 1, 1]
  // columns, so that both planes are made by the same two broadcasts.
  auto coefficients = t.t().contiguous().view({2, 3, 1, 1});
  auto planes = torch::empty({1, 2, oh, ow}, options);
  auto both = planes[0];  // [2, oh, ow]
  at::add_out(both, x * coefficients.select(1, 0), y * coefficients.select(1, 1));
  both.add_(coefficients.select(1, 2));
  return planes.permute({0, 2, 3, 1});
}

// Note [packed nearest warp]: nearest-neighbour sampling with zero padding
// only copies values, one whole pixel at a time: every channel of an output
// pixel comes from the same input pixel, or is 0 outside the image. So the
// two or three uint8 channels of a pixel can travel as one float32 value,
// c0 + 256 c1 + 65536 c2 (below 2^24, so exact in float32, and the packing
// sums are exact too), through one channel of grid_sampler, and be split
// again by shifts. Outside the image the packed 0 splits into zeros, which
// is the zero fill. The output bytes are those of sampling each channel,
// with a third of the gathers. On the project's CPU machine (224 px RGB,
// minimum of 2000 calls) a rotation plus an affine warp called one by one
// went from about 475 to 405 us; Compose keeps the pixels packed across a
// run of such warps (Note [packed warp chains] in tandem/data/transform.h),
// which takes seed 002's rotation and affine pair from 450 to 315 us.
torch::Tensor packed_nearest_grid(const torch::Tensor& image, const torch::Tensor& grid) {
  auto packed = detail::pack_pixels(image).unsqueeze(0);  // [1, 1, H, W]
  auto sampled = at::grid_sampler(packed, grid, /*interpolation_mode=*/1, /*padding_mode=*/0,
                                  /*align_corners=*/false);
  return detail::unpack_pixels(sampled[0], image.size(0));
}

// grid_sample with torchvision's fill: an extra channel of ones marks where
// the output saw the image. Nearest with an all-zero fill skips it: there the
// mask is exactly 0 or 1 and zero padding already gives the fill.
torch::Tensor apply_grid(const torch::Tensor& image, const torch::Tensor& grid,
                         const GridOptions& options, const char* who) {
  int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  int64_t oh = grid.size(1), ow = grid.size(2);
  if (image.numel() == 0) return image.reshape({channels, oh, ow});
  const auto& fill = options.fill;
  if (fill) {
    TANDEM_CHECK(fill->size() == 1 || static_cast<int64_t>(fill->size()) == channels, who,
                 ": fill must have 1 value or one per channel (", channels, "), got ", fill->size());
  }
  bool nearest = options.interpolation == InterpolationMode::kNearest;
  bool use_mask = fill.has_value() && !(nearest && detail::all_zero(*fill));
  bool fp = image.scalar_type() == torch::kFloat32;
  if (!fp && nearest && !use_mask && detail::packs_pixels(channels)) {
    return packed_nearest_grid(image, grid);
  }
  auto img = image.reshape({1, channels, height, width});
  if (!fp) img = img.to(torch::kFloat32);
  if (use_mask) img = torch::cat({img, torch::ones({1, 1, height, width}, img.options())}, 1);
  auto out = at::grid_sampler(img, grid, /*interpolation_mode=*/nearest ? 1 : 0,
                              /*padding_mode=*/0, /*align_corners=*/false);
  if (use_mask) {
    auto mask = out.slice(1, channels, channels + 1).expand({1, channels, oh, ow});
    out = out.slice(1, 0, channels);
    auto fill_img = torch::tensor(*fill, torch::kFloat32).view({1, -1, 1, 1});
    if (nearest) {
      out = torch::where(mask < 0.5, fill_img.expand_as(out), out);
    } else {
      out = out.sub_(fill_img).mul_(mask).add_(fill_img);
    }
  }
  if (!fp) {
    // Nearest sampling with a zero fill only copies pixels or zeros: the
    // values are whole numbers already, and rounding them would be a no-op.
    if (!(nearest && !use_mask)) out.round_();
    // The values are pixels, fills or rounded blends of the two, so they fit
    // in int32 unless a fill does not (Note [uint8 through int32]).
    bool int32_fill = true;
    if (fill) {
      for (double v : *fill) int32_fill = int32_fill && std::abs(v) < 2147483520.0;  // < 2^31 in float32
    }
    out = int32_fill ? detail::float_to_uint8(out) : out.to(image.scalar_type());
  }
  return out.reshape({channels, oh, ow});
}

}  // namespace

std::array<int64_t, 2> resized_size(int64_t in_height, int64_t in_width,
                                    const ResizeOptions& options) {
  const auto& size = options.size;
  TANDEM_CHECK(size.size() == 1 || size.size() == 2, "Resize",
               ": size must be one value (the smaller edge) or two (height, width), got ",
               size.size(), " values");
  for (auto s : size) TANDEM_CHECK(s > 0, "Resize: size must be positive, got ", detail::py_ints(size));
  if (size.size() == 2) return {size[0], size[1]};
  bool tall = in_width <= in_height;
  int64_t short_edge = tall ? in_width : in_height, long_edge = tall ? in_height : in_width;
  int64_t new_short = size[0];
  int64_t new_long = static_cast<int64_t>(static_cast<double>(new_short * long_edge) / short_edge);
  if (options.max_size) {
    int64_t max_size = *options.max_size;
    TANDEM_CHECK(max_size > new_short, "Resize: max_size (", max_size,
                 ") must be greater than the requested smaller edge (", new_short, ")");
    if (new_long > max_size) {
      new_short = static_cast<int64_t>(static_cast<double>(max_size * new_short) / new_long);
      new_long = max_size;
    }
  }
  return tall ? std::array<int64_t, 2>{new_long, new_short} : std::array<int64_t, 2>{new_short, new_long};
}

torch::Tensor resize(const torch::Tensor& image, const ResizeOptions& options) {
  check_image(image, "Resize");
  int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  auto [new_height, new_width] = resized_size(height, width, options);
  if (new_height == height && new_width == width) return image;
  if (image.numel() == 0) return image.reshape({channels, new_height, new_width});

  bool nearest = options.interpolation == InterpolationMode::kNearest;
  auto img = image.unsqueeze(0);
  // As torchvision: give a channels-last single image a batch stride that
  // keeps interpolate's output channels-last (pytorch/pytorch#68430).
  int64_t numel = image.numel();
  if (img.is_contiguous(at::MemoryFormat::ChannelsLast) && img.stride(0) != numel) {
    img = img.as_strided({1, channels, height, width},
                         {numel, img.stride(1), img.stride(2), img.stride(3)});
  }
  auto dtype = image.scalar_type();
  bool cast = dtype == torch::kUInt8 && !nearest && !native_uint8_bilinear();
  // Note [resize a contiguous box]: libtorch's vectorised uint8 kernel reads
  // 3- and 4-channel pixels in place only from a contiguous channels-last
  // tensor; from any other layout it first repacks every pixel in a scalar
  // loop. A crop of a decoded image is a channels-last view whose rows are
  // further apart than its width, so copying the box row by row first
  // (about 20 us for a 320 px box) saves that loop (about 140 us) and gives
  // the same bytes (tested). A planar image is left alone: turning it
  // channels-last costs more than the loop.
  if (dtype == torch::kUInt8 && !nearest && !cast && (channels == 3 || channels == 4) &&
      img.stride(1) == 1 && img.stride(3) == channels &&
      !img.is_contiguous(at::MemoryFormat::ChannelsLast)) {
    img = img.contiguous(at::MemoryFormat::ChannelsLast);
  }
  if (cast) img = img.to(torch::kFloat32);
  std::vector<int64_t> out_size = {new_height, new_width};
  torch::Tensor out;
  if (nearest) {
    out = at::upsample_nearest2d(img, out_size, std::nullopt, std::nullopt);
  } else if (options.antialias) {
    out = at::_upsample_bilinear2d_aa(img, out_size, /*align_corners=*/false, std::nullopt,
                                      std::nullopt);
  } else {
    out = at::upsample_bilinear2d(img, out_size, /*align_corners=*/false, std::nullopt,
                                  std::nullopt);
  }
  if (cast) out = detail::float_to_uint8(out.round_());  // rounded blends of pixels
  return out.reshape({channels, new_height, new_width});
}

torch::Tensor crop(const torch::Tensor& image, int64_t top, int64_t left, int64_t height,
                   int64_t width) {
  check_image(image, "crop");
  TANDEM_CHECK(height >= 0 && width >= 0, "crop: height and width must be >= 0, got ", height,
               " and ", width);
  int64_t h = image.size(1), w = image.size(2);
  int64_t right = left + width, bottom = top + height;
  if (left >= 0 && top >= 0 && right <= w && bottom <= h) {
    return image.slice(1, top, bottom).slice(2, left, right);
  }
  // Partly outside: crop what lies inside, zero-pad the rest.
  auto inside = image.slice(1, std::max<int64_t>(top, 0), bottom)
                    .slice(2, std::max<int64_t>(left, 0), right);
  std::vector<int64_t> padding = {
      std::max<int64_t>(std::min<int64_t>(right, 0) - left, 0),
      std::max<int64_t>(right - std::max(w, left), 0),
      std::max<int64_t>(std::min<int64_t>(bottom, 0) - top, 0),
      std::max<int64_t>(bottom - std::max(h, top), 0)};
  return at::constant_pad_nd(inside, padding, 0);
}

torch::Tensor center_crop(const torch::Tensor& image, const std::vector<int64_t>& size) {
  check_image(image, "CenterCrop");
  auto [crop_height, crop_width] = detail::parse_size(size, "CenterCrop");
  auto img = image;
  int64_t height = img.size(1), width = img.size(2);
  if (crop_height > height || crop_width > width) {
    auto before = [](int64_t crop, int64_t have) { return crop > have ? (crop - have) / 2 : 0; };
    auto after = [](int64_t crop, int64_t have) { return crop > have ? (crop - have + 1) / 2 : 0; };
    img = at::constant_pad_nd(img, {before(crop_width, width), after(crop_width, width),
                                    before(crop_height, height), after(crop_height, height)},
                              0);
    height = img.size(1);
    width = img.size(2);
    if (crop_height == height && crop_width == width) return img;
  }
  int64_t top = detail::round_half_even((height - crop_height) / 2.0);
  int64_t left = detail::round_half_even((width - crop_width) / 2.0);
  return img.slice(1, top, top + crop_height).slice(2, left, left + crop_width);
}

torch::Tensor pad(const torch::Tensor& image, const std::vector<int64_t>& padding,
                  const std::vector<double>& fill, PaddingMode padding_mode) {
  check_image(image, "pad");
  auto [left, top, right, bottom] = detail::parse_padding(padding, "pad");
  int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  std::vector<int64_t> lrtb = {left, right, top, bottom};
  switch (padding_mode) {
    case PaddingMode::kConstant: {
      if (fill.size() <= 1) return at::constant_pad_nd(image, lrtb, fill.empty() ? 0.0 : fill[0]);
      TANDEM_CHECK(static_cast<int64_t>(fill.size()) == channels, "pad: fill must have 1 value or ",
                   "one per channel (", channels, "), got ", fill.size());
      auto out = at::constant_pad_nd(image, lrtb, 0);
      auto value = torch::tensor(fill, torch::kFloat32).to(image.scalar_type()).view({-1, 1, 1});
      if (top > 0) out.slice(1, 0, top).copy_(value.expand({channels, top, out.size(2)}));
      if (left > 0) out.slice(2, 0, left).copy_(value.expand({channels, out.size(1), left}));
      if (bottom > 0) {
        out.slice(1, out.size(1) - bottom).copy_(value.expand({channels, bottom, out.size(2)}));
      }
      if (right > 0) {
        out.slice(2, out.size(2) - right).copy_(value.expand({channels, out.size(1), right}));
      }
      return out;
    }
    case PaddingMode::kEdge:
    case PaddingMode::kReflect: {
      TANDEM_CHECK(fill.size() <= 1, "pad: a per-channel fill needs padding_mode constant, not ",
                   to_string(padding_mode));
      // Pure copies: libtorch pads uint8 directly, with the values
      // torchvision gets through float32.
      if (padding_mode == PaddingMode::kEdge) return at::replication_pad2d(image, lrtb);
      TANDEM_CHECK(std::max(left, right) < width && std::max(top, bottom) < height,
                   "pad: reflect padding must be smaller than the image (", height, "x", width,
                   "), got ", detail::py_ints(padding));
      return at::reflection_pad2d(image, lrtb);
    }
    case PaddingMode::kSymmetric: {
      TANDEM_CHECK(fill.size() <= 1, "pad: a per-channel fill needs padding_mode constant, not ",
                   to_string(padding_mode));
      TANDEM_CHECK(std::max(left, right) <= width && std::max(top, bottom) <= height,
                   "pad: symmetric padding must not exceed the image (", height, "x", width,
                   "), got ", detail::py_ints(padding));
      // Mirror indices including the edge pixel: [p-1 .. 0] + [0 .. n-1] + [n-1 .. n-p].
      auto indices = [](int64_t before, int64_t n, int64_t after) {
        std::vector<int64_t> out;
        out.reserve(before + n + after);
        for (int64_t i = before - 1; i >= 0; --i) out.push_back(i);
        for (int64_t i = 0; i < n; ++i) out.push_back(i);
        for (int64_t i = 0; i < after; ++i) out.push_back(n - 1 - i);
        return torch::tensor(out, torch::kInt64);
      };
      return image.index_select(1, indices(top, height, bottom))
          .index_select(2, indices(left, width, right));
    }
  }
  TANDEM_FAIL("pad: unknown padding mode");
}

torch::Tensor hflip(const torch::Tensor& image) {
  check_image(image, "hflip");
  return image.flip(-1);
}

torch::Tensor vflip(const torch::Tensor& image) {
  check_image(image, "vflip");
  return image.flip(-2);
}

torch::Tensor rotate(const torch::Tensor& image, double angle, const GridOptions& options) {
  check_image(image, "rotate");
  // Python's angle % 360, in [0, 360).
  angle = std::fmod(angle, 360.0);
  if (angle < 0) angle += 360.0;
  if (angle == 0) angle = 0.0;  // no -0.0
  int64_t height = image.size(1), width = image.size(2);
  if (!options.center) {
    // Exact quarter turns are transpositions, as in torchvision.
    if (angle == 0) return image.clone();
    if (angle == 180) return torch::rot90(image, 2, {-2, -1});
    if (options.expand || height == width) {
      if (angle == 90) return torch::rot90(image, 1, {-2, -1});
      if (angle == 270) return torch::rot90(image, 3, {-2, -1});
    }
  }
  std::array<double, 2> center = {0.0, 0.0};
  if (options.center) {
    center = {(*options.center)[0] - width * 0.5, (*options.center)[1] - height * 0.5};
  }
  // rotate turns counter-clockwise, the affine matrix clockwise.
  auto matrix = inverse_affine_matrix(center, -angle, {0.0, 0.0}, 1.0, {0.0, 0.0});
  int64_t out_width = width, out_height = height;
  if (options.expand) {
    auto size = affine_output_size(matrix, width, height);
    out_width = size[0];
    out_height = size[1];
  }
  auto grid = affine_grid(theta_of(matrix), width, height, out_width, out_height);
  return apply_grid(image, grid, options, "rotate");
}

torch::Tensor affine(const torch::Tensor& image, const AffineParams& params,
                     const GridOptions& options) {
  check_image(image, "affine");
  TANDEM_CHECK(params.scale > 0, "affine: scale must be positive, got ",
               detail::py_float(params.scale));
  int64_t height = image.size(1), width = image.size(2);
  std::array<double, 2> center = {0.0, 0.0};
  if (options.center) {
    center = {(*options.center)[0] - width * 0.5, (*options.center)[1] - height * 0.5};
  }
  auto matrix =
      inverse_affine_matrix(center, params.angle, params.translate, params.scale, params.shear);
  auto grid = affine_grid(theta_of(matrix), width, height, width, height);
  return apply_grid(image, grid, options, "affine");
}

}  // namespace tandem::data::functional
