// tandem/checkpoint/safetensors.h: the safetensors weight format.
//
// File layout: an 8-byte little-endian header length N, N bytes of JSON
// ({"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
//   "__metadata__": {string: string}}), then the raw little-endian data.
// Written atomically (temporary file + rename). The reader checks every
// field and offset and throws tandem::Error naming the file on any defect.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

namespace tandem::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  NamedTensors tensors;  // in file order of their data
  std::map<std::string, std::string> metadata;
};

SafetensorsFile read_safetensors(const std::string& path);

// Copies the tensors of the safetensors file at `path` into `module`'s
// parameters and buffers of the same names (what --export-weights writes;
// torchvision's state_dict() names for resnet and mobilenetv2), converting
// to their dtypes and devices. Strict: throws tandem::Error naming the file
// and the tensor for a parameter or buffer the file lacks, a tensor the
// module lacks, or a shape that differs; nothing is copied then.
//
// `except`: names (a module's, like "fc", or a tensor's) whose parameters
// and buffers are left as they are and whose tensors in the file are
// ignored, e.g. a classifier head with another number of classes.
void load_weights(const std::string& path, torch::nn::Module& module,
                  const std::vector<std::string>& except = {});

// The same, from a file already read (`path` names it in messages).
void load_weights(const SafetensorsFile& file, const std::string& path, torch::nn::Module& module,
                  const std::vector<std::string>& except = {});

}  // namespace tandem::checkpoint
