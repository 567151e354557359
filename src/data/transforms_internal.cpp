#include "transforms_internal.h"

#include <charconv>
#include <cmath>

#include "tandem/data/transforms_functional.h"
#include "tandem/util/check.h"

namespace tandem::data {

std::string to_string(InterpolationMode mode) {
  return mode == InterpolationMode::kNearest ? "nearest" : "bilinear";
}

std::string to_string(PaddingMode mode) {
  switch (mode) {
    case PaddingMode::kConstant: return "constant";
    case PaddingMode::kEdge: return "edge";
    case PaddingMode::kReflect: return "reflect";
    case PaddingMode::kSymmetric: return "symmetric";
  }
  return "?";
}

namespace detail {

void check_image(const torch::Tensor& image, const char* who) {
  TANDEM_CHECK(image.defined(), who, ": expected an image tensor [C, H, W], got an undefined tensor");
  TANDEM_CHECK(image.dim() == 3, who, ": expected an image tensor [C, H, W], got ", image.sizes());
  auto type = image.scalar_type();
  TANDEM_CHECK(type == torch::kUInt8 || type == torch::kFloat32, who,
               ": expected a uint8 or float32 image, got ", type);
}

void check_color_image(const torch::Tensor& image, const char* who) {
  check_image(image, who);
  TANDEM_CHECK(image.size(0) == 1 || image.size(0) == 3, who,
               ": expected an image with 1 or 3 channels, got ", image.size(0));
}

// Note [uint8 through int32]: libtorch converts float32 to uint8 through
// int64 one value at a time (c10's static_cast_with_inter_type, so that
// negative values wrap instead of being undefined), about 120 us for a
// 3 x 224 x 224 image on the project's CPU machine, a fifth of a rotation.
// float32 -> int32 and int32 -> uint8 are vectorised (about 50 us
// together). Both truncate toward zero and then keep the low 8 bits, so
// they give the same bytes whenever the truncated value fits in int32.
torch::Tensor float_to_uint8(const torch::Tensor& values) {
  return values.to(torch::kInt32).to(torch::kUInt8);
}

bool packs_pixels(int64_t channels) { return channels == 2 || channels == 3; }

PixelView pixel_view(const torch::Tensor& image) {
  TANDEM_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8 && image.device().is_cpu(),
               "pixel_view: expected a uint8 [C, H, W] CPU tensor, got ", image.toString(), " ",
               image.sizes());
  return {image.data_ptr<uint8_t>(), image.size(0),   image.size(1),  image.size(2),
          image.stride(0),           image.stride(1), image.stride(2)};
}

bool all_zero(const std::vector<double>& fill) {
  for (double v : fill) {
    if (v != 0.0) return false;
  }
  return true;
}

// On the CPU, one pass of shifts over the bytes, whatever their layout
// (pixel_loops.h): libtorch's float32 cast and two scaled additions read a
// channels-last image (what the decoder and Resize give) with a stride of 3
// in every pass, 53 against 33 us at 224 px on the project's CPU machine.
// Elsewhere those libtorch operations, whose sums of whole numbers below
// 2^24 are exact in float32 in any order.
torch::Tensor pack_pixels(const torch::Tensor& image) {
  int64_t channels = image.size(0), height = image.size(1), width = image.size(2);
  TANDEM_CHECK(image.scalar_type() == torch::kUInt8 && packs_pixels(channels),
               "pack_pixels: expected a uint8 image with 2 or 3 channels, got ", image.toString(),
               " ", image.sizes());
  auto packed = torch::empty({1, height, width}, image.options().dtype(torch::kFloat32));
  if (image.device().is_cpu()) {
    pack_pixels_into(pixel_view(image), packed.data_ptr<float>());
    return packed;
  }
  auto pixels = image.to(torch::kFloat32);
  auto plane = packed[0];
  at::add_out(plane, pixels[0], pixels[1], 256);
  if (channels == 3) plane.add_(pixels[2], 65536);
  return packed;
}

// Whole numbers below 2^24: the int32 cast is exact, and int32 -> uint8
// keeps the low 8 bits.
torch::Tensor unpack_pixels(const torch::Tensor& packed, int64_t channels) {
  auto value = packed.to(torch::kInt32)[0];
  auto out = torch::empty({channels, packed.size(1), packed.size(2)}, torch::kUInt8);
  out[0].copy_(value);
  out[1].copy_(at::bitwise_right_shift(value, 8));
  if (channels == 3) out[2].copy_(at::bitwise_right_shift(value, 16));
  return out;
}

std::array<int64_t, 2> parse_size(const std::vector<int64_t>& size, const char* who) {
  TANDEM_CHECK(size.size() == 1 || size.size() == 2, who,
               ": size must be one value (a square) or two (height, width), got ", size.size(),
               " values");
  std::array<int64_t, 2> out = {size[0], size.back()};
  TANDEM_CHECK(out[0] > 0 && out[1] > 0, who, ": size must be positive, got ", py_ints(size));
  return out;
}

std::array<int64_t, 4> parse_padding(const std::vector<int64_t>& padding, const char* who) {
  std::array<int64_t, 4> ltrb;
  if (padding.size() == 1) {
    ltrb = {padding[0], padding[0], padding[0], padding[0]};
  } else if (padding.size() == 2) {
    ltrb = {padding[0], padding[1], padding[0], padding[1]};
  } else if (padding.size() == 4) {
    ltrb = {padding[0], padding[1], padding[2], padding[3]};
  } else {
    TANDEM_FAIL(who, ": padding must have 1, 2 or 4 values (left, top, right, bottom), got ",
                padding.size());
  }
  for (auto p : ltrb) TANDEM_CHECK(p >= 0, who, ": padding must be >= 0, got ", py_ints(padding));
  return ltrb;
}

std::array<double, 2> parse_degrees(const std::vector<double>& degrees, const char* who,
                                    const char* name) {
  if (degrees.size() == 1) {
    TANDEM_CHECK(degrees[0] >= 0, who, ": a single ", name, " value must be >= 0, got ",
                 py_float(degrees[0]));
    return {-degrees[0], degrees[0]};
  }
  TANDEM_CHECK(degrees.size() == 2, who, ": ", name, " must be one value or (min, max), got ",
               degrees.size(), " values");
  TANDEM_CHECK(degrees[0] <= degrees[1], who, ": ", name, " must be (min, max) with min <= max, got ",
               py_list(degrees));
  return {degrees[0], degrees[1]};
}

int64_t round_half_even(double value) {
  double r = std::round(value);  // halves away from zero
  if (std::fabs(value - std::trunc(value)) == 0.5) r = 2.0 * std::round(value / 2.0);
  return static_cast<int64_t>(r);
}

std::string py_float(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  std::string text(buffer, result.ptr);
  // to_chars picks fixed or scientific by length; Python switches to
  // scientific at exponents < -4 or >= 16. Only the plain cases matter here.
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

std::string py_number(double value) {
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    return std::to_string(static_cast<int64_t>(value));
  }
  return py_float(value);
}

std::string py_list(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + py_float(values[i]);
  return out + "]";
}

std::string py_tuple(const std::array<double, 2>& values) {
  return "(" + py_float(values[0]) + ", " + py_float(values[1]) + ")";
}

std::string py_ints(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + "]";
}

std::string size_text(const std::array<int64_t, 2>& size) {
  return "(" + std::to_string(size[0]) + ", " + std::to_string(size[1]) + ")";
}

std::string fill_text(const std::vector<double>& fill) {
  if (fill.size() == 1) return py_number(fill[0]);
  std::string out = "[";
  for (size_t i = 0; i < fill.size(); ++i) out += (i ? ", " : "") + py_number(fill[i]);
  return out + "]";
}

}  // namespace detail
}  // namespace tandem::data
