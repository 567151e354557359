// pixel_loops.h (private to src/data): loops that move uint8 pixels between
// layouts on raw pointers, for the transforms' hot path.
//
// No arithmetic of torchvision's happens here: packing is integer shifts
// (Note [packed nearest warp] in transforms_geometry.cpp), and the tabulated
// finish looks up values that libtorch's own ToTensor and Normalize operations
// computed (Note [tabulated finish] in tandem/data/transform.h). What the
// loops save is libtorch's passes over whole images for work that is a byte
// shuffle: a strided float cast and two strided additions to pack, and to
// finish, a split, a cast, two divisions and a subtraction, each writing a
// full-size temporary.
#pragma once

#include <cstdint>

namespace tandem::data::detail {

// A uint8 [channels, height, width] image with any strides (in elements).
struct PixelView {
  const uint8_t* data = nullptr;
  int64_t channels = 0, height = 0, width = 0;
  int64_t stride_c = 0, stride_h = 0, stride_w = 0;
};

// out[y * width + x] = c0 + 256 c1 (+ 65536 c2) of pixel (y, x), as float32;
// 2 or 3 channels.
void pack_pixels_into(const PixelView& image, float* out);

// out[(c * height + y) * width + x] = tables[c][image(c, y, x)]: each table
// holds 256 values.
void tabulate_pixels_into(const PixelView& image, const float* const* tables, float* out);

// The same from packed pixels (pixels values of c0 + 256 c1 + 65536 c2, whole
// numbers below 2^24): channel c of pixel i is byte c of the value.
void tabulate_packed_into(const float* packed, int64_t pixels, int64_t channels,
                          const float* const* tables, float* out);

}  // namespace tandem::data::detail
