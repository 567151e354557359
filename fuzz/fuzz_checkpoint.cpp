// libFuzzer target: the checkpoint reader (--resume), for a tiny model.
//
// Two paths, chosen by the input's first byte: the file as given (which the
// CRC-32 trailer must refuse unless it is whole), or the rest of the input
// as the archive, sealed with a valid trailer (engine::seal_checkpoint), so that the
// fuzzer gets past the checksum into the archive's parsing (libtorch's zip
// reader and tandem's reading of the keys).
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <torch/torch.h>

#include "fuzz_common.h"
#include "tandem/checkpoint/checkpoint.h"

namespace {

struct Tiny {
  torch::nn::Linear model{2, 2};
  torch::optim::SGD sgd{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  namespace fs = std::filesystem;
  Tiny tiny;
  auto scratch = fs::path(dir) / "scratch";
  tandem::checkpoint::Checkpointer checkpointer({scratch.string()});
  auto path = checkpointer.save({}, *tiny.model, tiny.sgd, "fuzz");
  // Seed 1: the whole file (path 0). Seed 2: its archive alone (path 1).
  auto whole = fs::path(dir) / "whole.pt";
  fs::copy_file(path, whole, fs::copy_options::overwrite_existing);
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string tagged = std::string(1, '\0') + bytes;
  tandem::fuzz::write_bytes((fs::path(dir) / "whole-tagged.pt").string(),
                            reinterpret_cast<const uint8_t*>(tagged.data()), tagged.size());
  std::string archive = std::string(1, '\1') + bytes.substr(0, bytes.size() - 20);
  tandem::fuzz::write_bytes((fs::path(dir) / "archive.pt").string(),
                            reinterpret_cast<const uint8_t*>(archive.data()), archive.size());
  fs::remove(whole);
  fs::remove_all(scratch);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& path = tandem::fuzz::input_path(".pt");
  if (data[0] % 2 == 0) {
    tandem::fuzz::write_bytes(path, data + 1, size - 1);
  } else {
    auto bytes = tandem::checkpoint::seal_checkpoint(std::string(reinterpret_cast<const char*>(data + 1), size - 1));
    tandem::fuzz::write_bytes(path, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  Tiny tiny;
  return tandem::fuzz::expect_result_or_error(
      [&] { tandem::checkpoint::Checkpointer({"/dev/shm"}).load(path, *tiny.model, tiny.sgd, "fuzz"); });
}
