#include "tandem/data/augment.h"

#include <algorithm>

#include "tandem/data/transforms.h"
#include "tandem/util/check.h"
#include "transforms_internal.h"

namespace tandem::data {
namespace {

enum class Preset { kNone, kCifar, kImagenet, kHeavy };

const std::vector<std::pair<std::string, Preset>>& presets() {
  static const std::vector<std::pair<std::string, Preset>> table = {
      {"none", Preset::kNone},
      {"cifar", Preset::kCifar},
      {"imagenet", Preset::kImagenet},
      {"heavy", Preset::kHeavy}};
  return table;
}

// The data set's image size and the size asked for, checked once.
struct Plan {
  Preset preset;
  int64_t size;            // image_size, or 0 for native
  int64_t native_height, native_width;
  bool square_native;      // every image is known to be square
};

Plan plan(const AugmentOptions& options, int64_t native_height, int64_t native_width) {
  std::string known;
  const Preset* preset = nullptr;
  for (const auto& [name, p] : presets()) {
    known += (known.empty() ? "" : ", ") + name;
    if (name == options.name) preset = &p;
  }
  TANDEM_CHECK_USAGE(preset, "--augment: expected one of ", known, ", got '", options.name, "'");
  TANDEM_CHECK(options.image_size >= 0, "--image-size must be >= 0, got ", options.image_size);
  TANDEM_CHECK(native_height >= 0 && native_width >= 0 && (native_height > 0) == (native_width > 0),
               "augment: the native image size must be given as two positive values or as 0 x 0 ",
               "(sizes vary), got ", native_height, "x", native_width);
  TANDEM_CHECK(options.image_size > 0 || native_height > 0,
               "--image-size is required when the images vary in size (--augment ", options.name,
               ")");
  TANDEM_CHECK(options.mean.size() == options.std.size(),
               "augment: mean and std must have the same number of values, got ",
               options.mean.size(), " and ", options.std.size());
  return {*preset, options.image_size, native_height, native_width,
          native_height > 0 && native_height == native_width};
}

TransformPtr resize_to(int64_t edge) {
  ResizeOptions options;
  options.size = {edge};
  return std::make_shared<Resize>(options);
}

TransformPtr center_crop_to(int64_t edge) {
  CenterCropOptions options;
  options.size = {edge};
  return std::make_shared<CenterCrop>(options);
}

bool crops_square(Preset preset) { return preset == Preset::kImagenet || preset == Preset::kHeavy; }

// The edge of the square output of the crop-based presets.
int64_t square_edge(const Plan& p) {
  return p.size > 0 ? p.size : std::min(p.native_height, p.native_width);
}

// Resize (+ CenterCrop for images that may not be square) to `size`, when
// the images are not already size x size.
void add_fit(const Plan& p, bool crop, std::vector<TransformPtr>& out) {
  if (p.size == 0 || (p.native_height == p.size && p.native_width == p.size)) return;
  out.push_back(resize_to(p.size));
  if (crop && !p.square_native) out.push_back(center_crop_to(p.size));
}

void add_tail(const AugmentOptions& options, std::vector<TransformPtr>& out) {
  out.push_back(std::make_shared<ToTensor>());
  if (!options.mean.empty()) {
    out.push_back(std::make_shared<Normalize>(NormalizeOptions{options.mean, options.std}));
  }
}

}  // namespace

TransformPtr make_train_transform(const AugmentOptions& options, int64_t native_height,
                                  int64_t native_width) {
  Plan p = plan(options, native_height, native_width);
  std::vector<TransformPtr> t;
  switch (p.preset) {
    case Preset::kNone:
      add_fit(p, /*crop=*/true, t);
      break;
    case Preset::kCifar: {
      add_fit(p, /*crop=*/false, t);
      RandomCropOptions crop;
      crop.size = p.size > 0 ? std::vector<int64_t>{p.size}
                             : std::vector<int64_t>{p.native_height, p.native_width};
      int64_t padding = std::min(crop.size.front(), crop.size.back()) / 8;
      if (padding > 0) crop.padding = {padding};
      t.push_back(std::make_shared<RandomCrop>(crop));
      t.push_back(std::make_shared<RandomHorizontalFlip>());
      break;
    }
    case Preset::kImagenet:
    case Preset::kHeavy: {
      RandomResizedCropOptions crop;
      crop.size = {square_edge(p)};
      t.push_back(std::make_shared<RandomResizedCrop>(crop));
      t.push_back(std::make_shared<RandomHorizontalFlip>());
      if (p.preset == Preset::kHeavy) {
        t.push_back(std::make_shared<RandomVerticalFlip>());
        RandomRotationOptions rotation;
        rotation.degrees = {45};
        t.push_back(std::make_shared<RandomRotation>(rotation));
        RandomAffineOptions affine;
        affine.degrees = {45};
        t.push_back(std::make_shared<RandomAffine>(affine));
        t.push_back(std::make_shared<ColorJitter>());
      }
      break;
    }
  }
  add_tail(options, t);
  return std::make_shared<Compose>(std::move(t));
}

TransformPtr make_eval_transform(const AugmentOptions& options, int64_t native_height,
                                 int64_t native_width) {
  Plan p = plan(options, native_height, native_width);
  std::vector<TransformPtr> t;
  if (crops_square(p.preset)) {
    // Resize to 256/224 of the crop, then take the central crop (the
    // ImageNet evaluation recipe).
    int64_t edge = square_edge(p);
    int64_t resized = detail::round_half_even(edge * 256.0 / 224.0);
    t.push_back(resize_to(resized));
    t.push_back(center_crop_to(edge));
  } else {
    add_fit(p, /*crop=*/true, t);
  }
  add_tail(options, t);
  return std::make_shared<Compose>(std::move(t));
}

std::array<int64_t, 2> augment_output_size(const AugmentOptions& options, int64_t native_height,
                                           int64_t native_width) {
  Plan p = plan(options, native_height, native_width);
  if (crops_square(p.preset)) return {square_edge(p), square_edge(p)};
  if (p.size > 0) return {p.size, p.size};
  return {p.native_height, p.native_width};
}

std::vector<std::string> augment_names() {
  std::vector<std::string> names;
  for (const auto& entry : presets()) names.push_back(entry.first);
  return names;
}

}  // namespace tandem::data
