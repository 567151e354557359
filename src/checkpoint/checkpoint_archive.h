// The checks that stand between a checkpoint file and libtorch's reader
// (checkpoint.cpp, and `tandem export`): the trailer's length and CRC, the
// pickles' bounds, every storage against its record, and every tensor
// within its storage. Internal to src/engine.
#pragma once

#include <string>
#include <vector>

#include <torch/serialize.h>
#include <torch/torch.h>

namespace tandem::checkpoint::internal {

// The checkpoint format this tandem writes and reads.
constexpr int64_t kFormatVersion = 2;

// Writes all of `bytes` to a new file at `path`; a short write (a full
// disk) is an error naming the path and the system's reason.
void write_file(const std::string& path, const std::string& bytes);

// The archive inside a checkpoint file, once its trailer checks out (Note
// [checkpoint trailer]); throws tandem::Error saying what is damaged.
std::string verified_archive(const std::string& path);

// Loads a verified archive after checking its pickles (Note [pickle
// bounds]) and, before any tensor's data is read, every tensor against its
// storage (Note [storage records]). Throws tandem::Error saying what is
// wrong.
void load_checked_archive(const std::string& bytes, torch::serialize::InputArchive& archive);

// A storage a pickle refers to (Note [storage references]): record
// <archive>/<key>, numel elements of torch.<type>, referred to at byte `at`.
struct StorageReference {
  std::string key;
  std::string type;
  uint64_t item_size = 0;
  int64_t numel = 0;
  size_t at = 0;
};
// Walks one pickle record opcode by opcode (Note [pickle bounds]) and
// returns the storages it refers to; throws tandem::Error naming the
// record when it overstates a length or memo index, or refers to a storage
// in a form torch does not write (checkpoint_pickle.cpp).
std::vector<StorageReference> check_pickle(const uint8_t* data, size_t size, const std::string& name);

// Runs stop before a checkpoint of a non-finite loss (Note [diverged]),
// but older ones did not: weights of NaN would train on in NaN, and the
// run would then blame its learning rate. Throws DamagedCheckpoint (passed
// over) naming `path` and the parameter `name` when `weight` holds NaN or
// infinite values.
void check_finite(const torch::Tensor& weight, const std::string& path, const std::string& name);

// Sets the default CPU generator's state to a checkpoint's `rng`; throws
// tandem::Error ("damaged: ...") for anything but such a state.
void set_cpu_rng(const torch::Tensor& rng);

// A tensor of an archive and its path in it ("model.fc1.weight").
struct ReadTensor {
  std::string name;
  torch::Tensor tensor;
};
// Every tensor in `value`, named `name` and the path below it.
void collect_tensors(const c10::IValue& value, const std::string& name, std::vector<ReadTensor>& out);

}  // namespace tandem::checkpoint::internal
