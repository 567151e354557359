// tandem/models/registry.h: model names -> factories, for the CLI.
//
// Built in: convnet, resnet18, resnet34, resnet50, mobilenetv2. Users add their
// own with register_model() before parsing flags.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "tandem/models/options.h"
#include "tandem/models/sequence.h"

namespace tandem::models {

using ModelFactory = std::function<Sequence(const ModelOptions&)>;

// Throws tandem::Error if the name is taken.
void register_model(const std::string& name, ModelFactory factory);

// Throws tandem::Error naming the known models when `name` is unknown.
Sequence make_model(const std::string& name, const ModelOptions& options);

// Sorted.
std::vector<std::string> model_names();

// Number of scalar parameters (not buffers).
int64_t count_parameters(const torch::nn::Module& module);

// The dtype of the first parameter (float32 when there is none): what the
// module's inputs are given in (--dtype).
torch::ScalarType parameter_dtype(const torch::nn::Module& module);

// --channels-last: every 4-D parameter to NHWC memory order, in place
// (set_data keeps the parameters' identity for optimizers and DDP).
void to_channels_last(torch::nn::Module& module);

}  // namespace tandem::models
