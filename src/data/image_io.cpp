#include "tandem/data/image_io.h"
#include "tandem/util/file.h"

#include <csetjmp>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <fstream>
#include <vector>

// clang-format off
#include <jpeglib.h>  // after <cstdio>: it needs FILE
#include <jerror.h>
// clang-format on
#include <png.h>

namespace tandem::data {

// Note [setjmp in the decoders]: libjpeg and libpng report errors by calling
// a handler that must not return; ours longjmp back to the decode function.
// A longjmp that skips a C++ destructor is undefined behaviour, so the two
// decode_*_raw functions below are plain C in C++ syntax: between setjmp and
// the end of the function no object has a destructor, the pixel buffer is
// malloc'd and freed by hand, and errors travel back as text. Their callers
// turn failures into ImageError and hand the buffer to a tensor.

namespace {

// Note [decompression bombs]: a few hundred bytes of JPEG or PNG can declare
// 65535 x 65535 pixels (12.9 GB decoded). Like PIL, which refuses images
// over 2 x 89,478,485 pixels (DecompressionBombError), tandem refuses to
// decode images larger than kMaxImagePixels: each decoder checks the size
// its header declares before it allocates anything, and says so in its
// state (`too_large`). (fuzz/fuzz_image found the allocation;
// fuzz/regressions/image.)
constexpr int64_t kMaxImagePixels = 2 * 89478485;

bool too_many_pixels(int64_t height, int64_t width) { return height * width > kMaxImagePixels; }

[[noreturn]] void refuse_bomb(const std::string& name, int64_t height, int64_t width) {
  throw ImageError(detail::str_cat(name, ": declares ", width, " x ", height,
                                   " pixels, over the limit of ", kMaxImagePixels,
                                   " (a decompression bomb?); not decoded"));
}

// ---- JPEG ----------------------------------------------------------------

struct JpegErrorState {
  jpeg_error_mgr mgr;  // first member: libjpeg hands us a pointer to it
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
  bool too_large = false;  // Note [decompression bombs]; then the declared size:
  int64_t height = 0, width = 0;
};

[[noreturn]] void jpeg_fail(j_common_ptr cinfo) {
  auto* state = reinterpret_cast<JpegErrorState*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, state->message);
  std::longjmp(state->jump, 1);
}

void jpeg_message(j_common_ptr cinfo, int level) {
  // A file that ends early decodes to grey in libjpeg with only a warning;
  // PIL refuses it ("image file is truncated"), and so do we. Other warnings
  // (extraneous bytes, corrupt data libjpeg recovered from) are accepted.
  if (level == -1 && cinfo->err->msg_code == JWRN_JPEG_EOF) jpeg_fail(cinfo);
}

struct RawImage {
  unsigned char* pixels = nullptr;  // malloc'd, [height, width, channels]
  int height = 0, width = 0, channels = 0;
  bool adobe_cmyk = false;  // CMYK stored inverted (Adobe marker)
};

bool decode_jpeg_raw(const uint8_t* data, size_t size, RawImage* out, JpegErrorState* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_message;
  err->message[0] = '\0';
  out->pixels = nullptr;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::free(out->pixels);
    out->pixels = nullptr;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (too_many_pixels(cinfo.image_height, cinfo.image_width)) {  // Note [decompression bombs]
    err->too_large = true;
    err->height = cinfo.image_height;
    err->width = cinfo.image_width;
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  out->height = static_cast<int>(cinfo.output_height);
  out->width = static_cast<int>(cinfo.output_width);
  out->channels = cinfo.output_components;
  out->adobe_cmyk = cmyk && cinfo.saw_Adobe_marker;
  size_t stride = static_cast<size_t>(out->width) * out->channels;
  out->pixels = static_cast<unsigned char*>(std::malloc(stride * out->height));
  if (out->pixels == nullptr) ERREXIT1(&cinfo, JERR_OUT_OF_MEMORY, 0);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out->pixels + stride * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// The size in the header, without decoding.
bool read_jpeg_size_raw(const uint8_t* data, size_t size, int* height, int* width, bool* cmyk,
                        JpegErrorState* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_message;
  err->message[0] = '\0';
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  *height = static_cast<int>(cinfo.image_height);
  *width = static_cast<int>(cinfo.image_width);
  *cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// Note [truncation without the tail]: libjpeg finds a truncated file only
// when it runs out of bytes, so a decoder that stops after a crop box would
// accept a file cut below the box. Entropy-coded data cannot contain the
// bytes FF D9 (every FF in it is followed by 00 or a restart marker's D0 to
// D7), so a single-scan JPEG whose scan is whole has an end-of-image marker
// after the scan's first byte, and a truncated one has none: libjpeg would
// run out of bytes exactly when that marker is missing. (Progressive and
// other multi-scan files are read whole by jpeg_start_decompress, which finds
// their truncation itself.) Looking for the marker from the end of the file
// costs nothing for a whole file and spares entropy-decoding the rows below
// the box, which the box decoder did before only to find truncation.
bool has_end_after(const uint8_t* begin, const uint8_t* end) {
  for (const uint8_t* p = end - 1; p > begin; --p) {
    if (*p == 0xD9 && p[-1] == 0xFF) return true;
  }
  return false;
}

// Rows [top, top + rows) and at least columns [left, left + cols) of an RGB
// JPEG; libjpeg widens the columns to whole iMCUs, and *x_offset says where
// `left` landed. The rows below are not decoded; a truncated file fails here
// as in decode_jpeg_raw (Note [truncation without the tail]).
bool decode_jpeg_rows_raw(const uint8_t* data, size_t size, int top, int rows, int left, int cols,
                          RawImage* out, int* x_offset, JpegErrorState* err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err->mgr);
  err->mgr.error_exit = jpeg_fail;
  err->mgr.emit_message = jpeg_message;
  err->message[0] = '\0';
  out->pixels = nullptr;
  if (setjmp(err->jump)) {
    jpeg_destroy_decompress(&cinfo);
    std::free(out->pixels);
    out->pixels = nullptr;
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  // The header ends with the first scan's header: its data starts here.
  if (!jpeg_has_multiple_scans(&cinfo) && !has_end_after(cinfo.src->next_input_byte, data + size)) {
    WARNMS(&cinfo, JWRN_JPEG_EOF);  // jpeg_message: fails as libjpeg's own would
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  JDIMENSION x = static_cast<JDIMENSION>(left), w = static_cast<JDIMENSION>(cols);
  if (w < cinfo.output_width) jpeg_crop_scanline(&cinfo, &x, &w);
  *x_offset = left - static_cast<int>(x);
  out->height = rows;
  out->width = static_cast<int>(cinfo.output_width);
  out->channels = cinfo.output_components;
  size_t stride = static_cast<size_t>(out->width) * out->channels;
  out->pixels = static_cast<unsigned char*>(std::malloc(stride * rows));
  if (out->pixels == nullptr) ERREXIT1(&cinfo, JERR_OUT_OF_MEMORY, 0);
  if (top > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(top));
  for (int r = 0; r < rows; ++r) {
    JSAMPROW row = out->pixels + stride * r;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_abort_decompress(&cinfo);  // the rows below are not needed
  jpeg_destroy_decompress(&cinfo);
  return true;
}

// ---- PNG -----------------------------------------------------------------

struct PngState {
  const uint8_t* data;
  size_t size;
  size_t offset;
  char message[256];
  bool too_large = false;  // Note [decompression bombs]; then the declared size:
  int64_t height = 0, width = 0;
};

void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* state = static_cast<PngState*>(png_get_io_ptr(png));
  if (n > state->size - state->offset) png_error(png, "file is truncated");
  std::memcpy(out, state->data + state->offset, n);
  state->offset += n;
}

[[noreturn]] void png_fail(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof state->message, "%s", message);
  png_longjmp(png, 1);
}

void png_warn(png_structp, png_const_charp) {}

bool decode_png_raw(PngState* state, RawImage* out) {
  state->message[0] = '\0';
  out->pixels = nullptr;
  png_bytep* rows = nullptr;
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, state, png_fail, png_warn);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof state->message, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    std::free(rows);
    std::free(out->pixels);
    out->pixels = nullptr;
    return false;
  }
  if (info == nullptr) png_error(png, "out of memory");
  png_set_read_fn(png, state, png_read_memory);
  png_read_info(png, info);
  state->height = png_get_image_height(png, info);
  state->width = png_get_image_width(png, info);
  if (too_many_pixels(state->height, state->width)) {  // Note [decompression bombs]
    state->too_large = true;
    png_error(png, "too many pixels");
  }
  int depth = png_get_bit_depth(png, info);
  int type = png_get_color_type(png, info);
  // To 8-bit RGB the way PIL's convert("RGB") does: palette expanded, grey
  // replicated, 16 bits cut to 8, alpha (and tRNS transparency) dropped.
  // Expanding a palette turns a tRNS chunk into an alpha channel, which is
  // then stripped like any other.
  if (depth == 16) png_set_strip_16(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if (type == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (type == PNG_COLOR_TYPE_GRAY || type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  if ((type & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS)) png_set_strip_alpha(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  out->height = static_cast<int>(png_get_image_height(png, info));
  out->width = static_cast<int>(png_get_image_width(png, info));
  out->channels = png_get_channels(png, info);
  size_t stride = png_get_rowbytes(png, info);
  if (out->channels != 3 || stride != static_cast<size_t>(out->width) * 3) {
    png_error(png, "unexpected pixel layout after conversion to 8-bit RGB");
  }
  out->pixels = static_cast<unsigned char*>(std::malloc(stride * out->height));
  rows = static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * out->height));
  if (out->pixels == nullptr || rows == nullptr) png_error(png, "out of memory");
  for (int y = 0; y < out->height; ++y) rows[y] = out->pixels + stride * y;
  png_read_image(png, rows);
  // The chunks after the pixels (IEND, text) are not read: PIL ignores them too.
  png_destroy_read_struct(&png, &info, nullptr);
  std::free(rows);
  return true;
}

// ---- to tensors ----------------------------------------------------------

// The malloc'd [H, W, C] buffer as uint8 [3, H, W] (a channels-last view).
torch::Tensor to_tensor(RawImage& raw) {
  auto hwc = torch::from_blob(
      raw.pixels, {raw.height, raw.width, raw.channels}, [](void* p) { std::free(p); },
      torch::kUInt8);
  raw.pixels = nullptr;
  return hwc.permute({2, 0, 1});
}

// CMYK to RGB as r = (255 - c) * (255 - k) / 255, rounded (PIL's formula,
// up to its rounding), on values that Adobe's writers store inverted.
torch::Tensor cmyk_to_rgb(torch::Tensor cmyk, bool inverted) {
  auto v = cmyk.to(torch::kInt32);
  if (!inverted) v = 255 - v;
  auto k = v.select(0, 3);
  auto rgb = (v.slice(0, 0, 3) * k + 127).div(255, "floor");
  return rgb.to(torch::kUInt8).contiguous();
}

}  // namespace

ImageFormat sniff_image_format(const uint8_t* data, size_t size) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size >= 3 && data[0] == 0xff && data[1] == 0xd8 && data[2] == 0xff) return ImageFormat::kJpeg;
  if (size >= 8 && std::memcmp(data, kPng, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

torch::Tensor decode_image(const uint8_t* data, size_t size, const std::string& name) {
  RawImage raw;
  switch (sniff_image_format(data, size)) {
    case ImageFormat::kJpeg: {
      JpegErrorState err;
      if (!decode_jpeg_raw(data, size, &raw, &err)) {
        if (err.too_large) refuse_bomb(name, err.height, err.width);
        throw ImageError(detail::str_cat(name, ": not a readable JPEG (", err.message, ")"));
      }
      if (raw.channels == 4) {
        bool inverted = raw.adobe_cmyk;
        return cmyk_to_rgb(to_tensor(raw), inverted);
      }
      if (raw.channels != 3) {
        std::free(raw.pixels);
        throw ImageError(detail::str_cat(name, ": JPEG decoded to ", raw.channels,
                                         " channels, expected RGB"));
      }
      return to_tensor(raw);
    }
    case ImageFormat::kPng: {
      PngState state{data, size, 0, {}};
      if (!decode_png_raw(&state, &raw)) {
        if (state.too_large) refuse_bomb(name, state.height, state.width);
        throw ImageError(detail::str_cat(name, ": not a readable PNG (", state.message, ")"));
      }
      return to_tensor(raw);
    }
    case ImageFormat::kUnknown:
      break;
  }
  throw ImageError(detail::str_cat(name, ": not a JPEG or PNG image (",
                                   size == 0 ? "empty file" : "unrecognised first bytes", ")"));
}

torch::Tensor decode_image_box(const uint8_t* data, size_t size, const std::string& name,
                               const BoxChooser& choose) {
  auto slice = [](const torch::Tensor& image, const CropBox& b, int64_t top, int64_t left) {
    return image.slice(1, b.top - top, b.top - top + b.height)
        .slice(2, b.left - left, b.left - left + b.width);
  };
  auto check_box = [&](const CropBox& b, int64_t height, int64_t width) {
    TANDEM_CHECK(b.top >= 0 && b.left >= 0 && b.height > 0 && b.width > 0 &&
                     b.top + b.height <= height && b.left + b.width <= width,
                 name, ": crop box (top ", b.top, ", left ", b.left, ", ", b.height, " x ", b.width,
                 ") is not inside the ", height, " x ", width, " image");
  };
  int height = 0, width = 0;
  bool cmyk = false;
  JpegErrorState err;
  if (sniff_image_format(data, size) != ImageFormat::kJpeg ||
      !read_jpeg_size_raw(data, size, &height, &width, &cmyk, &err) || cmyk) {
    auto image = decode_image(data, size, name);  // reports any error itself
    auto box = choose(image.size(1), image.size(2));
    check_box(box, image.size(1), image.size(2));
    return slice(image, box, 0, 0);
  }
  if (too_many_pixels(height, width)) refuse_bomb(name, height, width);  // Note [decompression bombs]
  auto box = choose(height, width);
  check_box(box, height, width);
  // A margin around the box keeps libjpeg's edge handling (chroma
  // upsampling at the first and last decoded row and column) off the pixels
  // we return; 16 covers the largest iMCU.
  constexpr int64_t kMargin = 16;
  int64_t top = std::max<int64_t>(box.top - kMargin, 0);
  int64_t bottom = std::min<int64_t>(box.top + box.height + kMargin, height);
  int64_t left = std::max<int64_t>(box.left - kMargin, 0);
  int64_t right = std::min<int64_t>(box.left + box.width + kMargin, width);
  RawImage raw;
  int x_offset = 0;
  if (!decode_jpeg_rows_raw(data, size, static_cast<int>(top), static_cast<int>(bottom - top),
                            static_cast<int>(left), static_cast<int>(right - left), &raw,
                            &x_offset, &err)) {
    throw ImageError(detail::str_cat(name, ": not a readable JPEG (", err.message, ")"));
  }
  if (raw.channels != 3) {
    std::free(raw.pixels);
    throw ImageError(detail::str_cat(name, ": JPEG decoded to ", raw.channels,
                                     " channels, expected RGB"));
  }
  return slice(to_tensor(raw), box, top, left - x_offset);
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  // Not a regular file (a FIFO would block the read for ever): a bad image
  // like any other that cannot be read (Note [special files]).
  std::string bytes;
  try {
    bytes = read_regular_file(path, "an image file");
  } catch (const Error& e) {
    throw ImageError(e.what());
  }
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

torch::Tensor read_image(const std::string& path) {
  auto bytes = read_file_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path);
}

namespace {

torch::Tensor to_hwc(const torch::Tensor& image, const char* what) {
  TANDEM_CHECK(image.dim() == 3 && image.scalar_type() == torch::kUInt8 &&
                   (image.size(0) == 1 || image.size(0) == 3),
               what, ": expected a uint8 [C, H, W] tensor with C = 1 or 3, got ",
               image.toString(), " ", image.sizes());
  return image.permute({1, 2, 0}).contiguous();
}

struct JpegWriteState {
  JpegErrorState err;
  std::FILE* file;
};

bool write_jpeg_raw(JpegWriteState* s, const unsigned char* pixels, int h, int w, int c,
                    int quality) {
  jpeg_compress_struct cinfo;
  cinfo.err = jpeg_std_error(&s->err.mgr);
  s->err.mgr.error_exit = jpeg_fail;
  s->err.message[0] = '\0';
  if (setjmp(s->err.jump)) {
    jpeg_destroy_compress(&cinfo);
    return false;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, s->file);
  cinfo.image_width = static_cast<JDIMENSION>(w);
  cinfo.image_height = static_cast<JDIMENSION>(h);
  cinfo.input_components = c;
  cinfo.in_color_space = c == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<unsigned char*>(pixels) + static_cast<size_t>(w) * c * cinfo.next_scanline;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return true;
}

}  // namespace

void write_jpeg(const std::string& path, const torch::Tensor& image, int quality) {
  TANDEM_CHECK(quality >= 1 && quality <= 100, "write_jpeg: quality must be in 1..100, got ", quality);
  auto hwc = to_hwc(image, "write_jpeg");
  JpegWriteState state;
  state.file = std::fopen(path.c_str(), "wb");
  TANDEM_CHECK(state.file != nullptr, path, ": cannot create (", std::strerror(errno), ")");
  bool ok = write_jpeg_raw(&state, hwc.data_ptr<uint8_t>(), static_cast<int>(hwc.size(0)),
                           static_cast<int>(hwc.size(1)), static_cast<int>(hwc.size(2)), quality);
  bool closed = std::fclose(state.file) == 0;
  TANDEM_CHECK(ok, path, ": JPEG encoding failed (", state.err.message, ")");
  TANDEM_CHECK(closed, path, ": write failed (", std::strerror(errno), ")");
}

void write_png(const std::string& path, const torch::Tensor& image) {
  auto hwc = to_hwc(image, "write_png");
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.height = static_cast<png_uint_32>(hwc.size(0));
  png.width = static_cast<png_uint_32>(hwc.size(1));
  png.format = hwc.size(2) == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  int ok = png_image_write_to_file(&png, path.c_str(), 0, hwc.data_ptr<uint8_t>(), 0, nullptr);
  std::string message = png.message;
  png_image_free(&png);
  TANDEM_CHECK(ok, path, ": PNG encoding failed (", message, ")");
}

}  // namespace tandem::data
