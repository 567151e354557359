// libFuzzer target: the safetensors reader (--export-weights files read back).
#include <torch/torch.h>

#include "fuzz_common.h"
#include "tandem/checkpoint/safetensors.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  tandem::checkpoint::write_safetensors(
      dir + "/two-tensors.safetensors",
      {{"fc.weight", torch::arange(6, torch::kFloat32).reshape({2, 3})},
       {"fc.steps", torch::tensor({7}, torch::kInt64)}},
      {{"format", "pt"}});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& path = tandem::fuzz::input_path();
  tandem::fuzz::write_bytes(path, data, size);
  return tandem::fuzz::expect_result_or_error([&] { tandem::checkpoint::read_safetensors(path); });
}
