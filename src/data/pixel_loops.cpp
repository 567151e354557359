#include "pixel_loops.h"

namespace tandem::data::detail {

void pack_pixels_into(const PixelView& image, float* out) {
  const int64_t sc = image.stride_c, sw = image.stride_w;
  for (int64_t y = 0; y < image.height; ++y) {
    const uint8_t* row = image.data + y * image.stride_h;
    float* o = out + y * image.width;
    if (image.channels == 3) {
      for (int64_t x = 0; x < image.width; ++x) {
        const uint8_t* p = row + x * sw;
        o[x] = static_cast<float>(int32_t{p[0]} | (int32_t{p[sc]} << 8) | (int32_t{p[2 * sc]} << 16));
      }
    } else {
      for (int64_t x = 0; x < image.width; ++x) {
        const uint8_t* p = row + x * sw;
        o[x] = static_cast<float>(int32_t{p[0]} | (int32_t{p[sc]} << 8));
      }
    }
  }
}

void tabulate_pixels_into(const PixelView& image, const float* const* tables, float* out) {
  for (int64_t c = 0; c < image.channels; ++c) {
    const float* table = tables[c];
    for (int64_t y = 0; y < image.height; ++y) {
      const uint8_t* row = image.data + c * image.stride_c + y * image.stride_h;
      float* o = out + (c * image.height + y) * image.width;
      if (image.stride_w == 1) {
        for (int64_t x = 0; x < image.width; ++x) o[x] = table[row[x]];
      } else {
        for (int64_t x = 0; x < image.width; ++x) o[x] = table[row[x * image.stride_w]];
      }
    }
  }
}

// One pass over the packed values, all channels at once: each value is read
// and converted once.
void tabulate_packed_into(const float* packed, int64_t pixels, int64_t channels,
                          const float* const* tables, float* out) {
  const float* t0 = tables[0];
  const float* t1 = tables[1];
  float* o0 = out;
  float* o1 = out + pixels;
  if (channels == 3) {
    const float* t2 = tables[2];
    float* o2 = out + 2 * pixels;
    for (int64_t i = 0; i < pixels; ++i) {
      auto v = static_cast<int32_t>(packed[i]);
      o0[i] = t0[v & 255];
      o1[i] = t1[(v >> 8) & 255];
      o2[i] = t2[(v >> 16) & 255];
    }
  } else {
    for (int64_t i = 0; i < pixels; ++i) {
      auto v = static_cast<int32_t>(packed[i]);
      o0[i] = t0[v & 255];
      o1[i] = t1[(v >> 8) & 255];
    }
  }
}

}  // namespace tandem::data::detail
