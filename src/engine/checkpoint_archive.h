// The checks that stand between a checkpoint file and libtorch's reader
// (checkpoint.cpp, and `tandem export`): the trailer's length and CRC, the
// pickles' bounds, and every tensor within its storage. Internal to
// src/engine.
#pragma once

#include <string>
#include <vector>

#include <torch/serialize.h>
#include <torch/torch.h>

namespace tandem::engine::internal {

// The checkpoint format this tandem writes and reads.
constexpr int64_t kFormatVersion = 2;

// The archive inside a checkpoint file, once its trailer checks out (Note
// [checkpoint trailer]); throws tandem::Error saying what is damaged.
std::string verified_archive(const std::string& path);

// Loads a verified archive after checking its pickles (Note [pickle
// bounds]) and, before any tensor's data is read, every tensor against its
// storage (Note [storage records]). Throws tandem::Error saying what is
// wrong.
void load_checked_archive(const std::string& bytes, torch::serialize::InputArchive& archive);

// A tensor of an archive and its path in it ("model.fc1.weight").
struct ReadTensor {
  std::string name;
  torch::Tensor tensor;
};
// Every tensor in `value`, named `name` and the path below it.
void collect_tensors(const c10::IValue& value, const std::string& name, std::vector<ReadTensor>& out);

}  // namespace tandem::engine::internal
