// Helpers shared by the transform sources (not installed): argument checks
// and torchvision-style text for describe().
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "pixel_loops.h"

namespace tandem::data::detail {

// Requires a [C, H, W] image of uint8 or float32; `who` names the operation.
void check_image(const torch::Tensor& image, const char* who);
// check_image plus 1 or 3 channels (the colour operations).
void check_color_image(const torch::Tensor& image, const char* who);

// {edge} or {height, width} -> {height, width}, both positive.
std::array<int64_t, 2> parse_size(const std::vector<int64_t>& size, const char* who);
// 1, 2 or 4 non-negative values -> (left, top, right, bottom).
std::array<int64_t, 4> parse_padding(const std::vector<int64_t>& padding, const char* who);
// {d} -> [-d, d] (d >= 0); {min, max} with min <= max.
std::array<double, 2> parse_degrees(const std::vector<double>& degrees, const char* who,
                                    const char* name);

// float32 pixel values -> uint8, the same bytes as values.to(torch::kUInt8)
// for every value whose truncation fits in int32 (Note [uint8 through
// int32]); the callers' values are rounded or clamped pixels.
torch::Tensor float_to_uint8(const torch::Tensor& values);

// Packed pixels (Note [packed nearest warp] in transforms_geometry.cpp):
// whether an image of this many channels packs (2 or 3; one channel has
// nothing to gain); a uint8 [C, H, W] image -> float32 [1, H, W] holding
// c0 + 256 c1 + 65536 c2; and back, given C.
bool packs_pixels(int64_t channels);
// A uint8 [C, H, W] CPU tensor's pixels, for the loops of pixel_loops.h.
PixelView pixel_view(const torch::Tensor& image);
// Whether every fill value is 0 (true for none): a nearest-neighbour warp
// with such a fill needs no mask and can run on packed pixels.
bool all_zero(const std::vector<double>& fill);
torch::Tensor pack_pixels(const torch::Tensor& image);
torch::Tensor unpack_pixels(const torch::Tensor& packed, int64_t channels);

// Python's round(): halves to even.
int64_t round_half_even(double value);

// Python's repr of a float: shortest round-trip digits, "1.0" not "1".
std::string py_float(double value);
// A number as the user most likely wrote it: "0" for 0.0, else py_float.
std::string py_number(double value);
std::string py_list(const std::vector<double>& values);       // [a, b]
std::string py_tuple(const std::array<double, 2>& values);     // (a, b)
std::string py_ints(const std::vector<int64_t>& values);       // [a, b]
std::string size_text(const std::array<int64_t, 2>& size);     // (h, w)
std::string fill_text(const std::vector<double>& fill);        // 0 or [a, b, c]

}  // namespace tandem::data::detail
