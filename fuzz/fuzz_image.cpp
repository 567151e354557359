// libFuzzer target: the image-decoding wrappers (JPEG through libjpeg-turbo,
// PNG through libpng), whole images and cropped decoding.
#include <torch/torch.h>

#include "fuzz_common.h"
#include "tandem/data/image_io.h"
#include "tandem/data/transform.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  auto image = torch::arange(3 * 12 * 10, torch::kInt64).remainder(251).to(torch::kUInt8).reshape({3, 12, 10});
  tandem::data::write_png(dir + "/small.png", image);
  tandem::data::write_jpeg(dir + "/small.jpg", image);
  tandem::data::write_png(dir + "/gray.png", image.narrow(0, 0, 1));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::fuzz::expect_result_or_error([&] { tandem::data::decode_image(data, size, "fuzz"); });
  return tandem::fuzz::expect_result_or_error([&] {
    tandem::data::decode_image_box(data, size, "fuzz", [](int64_t height, int64_t width) {
      return tandem::data::CropBox{height / 4, width / 4, std::max<int64_t>(1, height / 2),
                                   std::max<int64_t>(1, width / 2)};
    });
  });
}
