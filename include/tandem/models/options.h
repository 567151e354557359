// tandem/models/options.h: what every model factory is told about its task.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <torch/nn/modules/container/any.h>

namespace tandem::models {

// Makes the normalisation layer that follows a convolution with `channels`
// outputs. Models call it for every BatchNorm2d they would have; the trainer's
// --sync-bn passes one that makes parallel::SyncBatchNorm.
using NormFactory = std::function<torch::nn::AnyModule(int64_t channels)>;

// factory(channels), or torch::nn::BatchNorm2d(channels) when it is empty.
torch::nn::AnyModule make_norm(const NormFactory& factory, int64_t channels);

// The widest MobileNetV2 built: 100 times the channels is already far past
// any memory (its last layer 128,000 wide); much wider, the channel counts
// overflow and a small model came out of 1e19 (a sweep's find).
constexpr double kMaxWidthMult = 100;

struct ModelOptions {
  int64_t in_channels = 3;   // taken from the data set
  int64_t num_classes = 10;  // taken from the data set
  int64_t image_size = 32;   // side of the (square) input
  double width_mult = 1.0;   // MobileNetV2's width multiplier, up to kMaxWidthMult
  // ResNet stem: "imagenet" (7x7/2 conv + max pool), "cifar" (3x3/1 conv, no
  // pool) or "auto" (cifar when image_size <= 64).
  std::string stem = "auto";
  NormFactory norm_layer;  // empty: BatchNorm2d
  // Language models (ModelKind::kLanguageModel in models/registry.h):
  int64_t vocab_size = 0;  // taken from the data set (its tokens' vocabulary)
  int64_t seq_len = 0;     // --seq-len: the longest sequence trained on, at most the model's context
  double dropout = 0.0;    // --dropout: GPT-2's (Gpt2Config::dropout)
};

// The ResNet stem `o` builds: "cifar" or "imagenet" ("auto" resolved by
// image_size). Throws tandem::Error for any other stem.
std::string resolved_stem(const ModelOptions& o);

}  // namespace tandem::models
