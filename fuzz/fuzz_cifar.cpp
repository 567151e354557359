// libFuzzer target: the CIFAR-10 and CIFAR-100 binary readers.
#include <vector>

#include "fuzz_common.h"
#include "tandem/data/cifar.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  std::vector<uint8_t> record(1 + 3072);  // CIFAR-10: label, then 3 x 32 x 32
  record[0] = 3;
  for (size_t i = 1; i < record.size(); ++i) record[i] = static_cast<uint8_t>(i * 7);
  tandem::fuzz::write_bytes(dir + "/one-record.bin", record.data(), record.size());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& path = tandem::fuzz::input_path();
  tandem::fuzz::write_bytes(path, data, size);
  using tandem::data::CifarKind;
  tandem::fuzz::expect_result_or_error(
      [&] { tandem::data::read_cifar({path}, CifarKind::kCifar10, "fuzz"); });
  return tandem::fuzz::expect_result_or_error(
      [&] { tandem::data::read_cifar({path}, CifarKind::kCifar100, "fuzz"); });
}
