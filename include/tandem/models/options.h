// tandem/models/options.h: what every model factory is told about its task.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::models {

struct ModelOptions {
  int64_t in_channels = 3;   // taken from the data set
  int64_t num_classes = 10;  // taken from the data set
  int64_t image_size = 32;   // side of the (square) input
  double width_mult = 1.0;   // MobileNetV2's width multiplier
  // ResNet stem: "imagenet" (7x7/2 conv + max pool), "cifar" (3x3/1 conv, no
  // pool) or "auto" (cifar when image_size <= 64).
  std::string stem = "auto";
};

}  // namespace tandem::models
