// tandem/data/augment.h: the named --augment presets (docs/DATA.md).
//
// A preset is a pair of pipelines over uint8 [C, H, W] images: a random one
// for training and a deterministic one for evaluation, both ending in
// ToTensor and Normalize (the latter when mean/std are given), so that every
// sample comes out float32 [C, out_h, out_w] with out = output_size(...).
//
//   none      resize (and centre-crop) to image_size if needed
//   cifar     + RandomCrop(image_size, padding=image_size/8), horizontal flip
//   imagenet  RandomResizedCrop(image_size), horizontal flip;
//             eval: Resize(round(image_size*256/224)), CenterCrop(image_size)
//   heavy     imagenet + vertical flip, RandomRotation(45), RandomAffine(45),
//             ColorJitter()
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/data/transform.h"

namespace tandem::data {

struct AugmentOptions {
  std::string name;        // one of augment_names()
  int64_t image_size = 0;  // 0: the data set's native size
  std::vector<double> mean, std;  // per channel normalisation; both empty: none
};

// native_height / native_width: the data set's image size, or 0 when images
// vary in size (then image_size must be given).
TransformPtr make_train_transform(const AugmentOptions& options, int64_t native_height,
                                  int64_t native_width);
TransformPtr make_eval_transform(const AugmentOptions& options, int64_t native_height,
                                 int64_t native_width);

// (height, width) of the images both pipelines produce.
std::array<int64_t, 2> augment_output_size(const AugmentOptions& options, int64_t native_height,
                                           int64_t native_width);

// The preset names, for --help.
std::vector<std::string> augment_names();

}  // namespace tandem::data
