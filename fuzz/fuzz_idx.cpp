// libFuzzer target: the IDX reader (MNIST / Fashion-MNIST files, plain or
// gzip), with 1 (labels) and 3 (images) dimensions.
#include <vector>

#include "fuzz_common.h"
#include "tandem/data/idx.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  // Images: magic 0x00000803, 2 images of 3 x 2, then the bytes.
  std::vector<uint8_t> images = {0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 2};
  for (int i = 0; i < 12; ++i) images.push_back(static_cast<uint8_t>(i * 20));
  tandem::fuzz::write_bytes(dir + "/images.idx", images.data(), images.size());
  std::vector<uint8_t> labels = {0, 0, 8, 1, 0, 0, 0, 3, 7, 1, 4};
  tandem::fuzz::write_bytes(dir + "/labels.idx", labels.data(), labels.size());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& path = tandem::fuzz::input_path();
  tandem::fuzz::write_bytes(path, data, size);
  tandem::fuzz::expect_result_or_error([&] { tandem::data::read_idx(path, 3); });
  return tandem::fuzz::expect_result_or_error([&] { tandem::data::read_idx(path, 1); });
}
