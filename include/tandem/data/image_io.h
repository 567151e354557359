// tandem/data/image_io.h: JPEG and PNG files to and from uint8 tensors.
//
// Decoding goes through libjpeg-turbo and libpng (Debian's packages) and
// always yields RGB as uint8 [3, H, W], the layout torchvision's read_image
// gives: grayscale is replicated to three channels and an alpha channel is
// dropped, as PIL's convert("RGB") does for ImageFolder. The format is taken
// from the file's first bytes, not its name.
//
// Every failure throws ImageError naming the file and what was expected: not
// a JPEG or PNG, truncated, corrupt, or a colour model we do not convert
// (CMYK JPEG). A damaged JPEG that libjpeg can still decode completely (a
// "corrupt data" warning) is accepted, as PIL accepts it; a JPEG that ends
// before its last scan is an error, as in PIL.
//
// Thread safety: all functions may be called from several threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/data/transform.h"
#include "tandem/util/check.h"

namespace tandem::data {

// An image that cannot be read or decoded. Loaders may skip these
// (--skip-bad-images); every other error stops the run.
class ImageError : public Error {
 public:
  using Error::Error;
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// The format named by the first bytes of a file (its magic number).
ImageFormat sniff_image_format(const uint8_t* data, size_t size);

// Decodes an in-memory JPEG or PNG to uint8 [3, H, W]. `name` (a path) is
// used in error messages only.
torch::Tensor decode_image(const uint8_t* data, size_t size, const std::string& name);

// Reads and decodes the file at `path`.
torch::Tensor read_image(const std::string& path);

// Decodes one box of an in-memory image: `choose` gets the image's (height,
// width) and returns a box inside it. A JPEG decodes only the rows and
// columns the box needs (Note [decoding only the crop]), still checking the
// whole file for truncation; the pixels equal those of decode_image. Other
// formats decode whole. Returns uint8 [3, box.height, box.width].
using BoxChooser = std::function<CropBox(int64_t height, int64_t width)>;
torch::Tensor decode_image_box(const uint8_t* data, size_t size, const std::string& name,
                               const BoxChooser& choose);

// The bytes of the file at `path`; throws ImageError naming it.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// Writes uint8 [C, H, W] (C = 1 or 3) as a baseline JPEG of the given quality
// (1..100) or as a PNG; for tests, tools and debugging augmentations.
void write_jpeg(const std::string& path, const torch::Tensor& image, int quality = 90);
void write_png(const std::string& path, const torch::Tensor& image);

}  // namespace tandem::data
