// The --augment presets (their pipelines and output shapes) and the error
// messages of the transforms.
#include <gtest/gtest.h>

#include "tandem/data/augment.h"
#include "tandem/data/transforms.h"
#include "tandem/util/check.h"

namespace tandem::data {
namespace {

namespace F = functional;

using testing::error_of;

torch::Tensor bytes(std::vector<int64_t> shape) {
  return torch::randint(0, 256, shape, torch::kInt64).to(torch::kUInt8);
}

const std::vector<double> kMean = {0.5, 0.4, 0.3}, kStd = {0.2, 0.25, 0.3};

std::vector<int64_t> output_shape(const TransformPtr& t, const torch::Tensor& image) {
  SampleRng rng(0, 0, 3);
  auto out = t->apply(image, rng);
  EXPECT_EQ(out.scalar_type(), torch::kFloat32);
  return out.sizes().vec();
}

TEST(AugmentTest, PresetPipelines) {
  EXPECT_EQ(augment_names(), (std::vector<std::string>{"none", "cifar", "imagenet", "heavy"}));
  AugmentOptions o{"cifar", 0, kMean, kStd};
  EXPECT_EQ(make_train_transform(o, 32, 32)->describe(),
            "Compose(\n"
            "    RandomCrop(size=(32, 32), padding=4)\n"
            "    RandomHorizontalFlip(p=0.5)\n"
            "    ToTensor()\n"
            "    Normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])\n"
            ")");
  EXPECT_EQ(make_eval_transform(o, 32, 32)->describe(),
            "Compose(\n"
            "    ToTensor()\n"
            "    Normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])\n"
            ")");
  o.image_size = 64;  // upsampled CIFAR
  EXPECT_EQ(make_train_transform(o, 32, 32)->describe(),
            "Compose(\n"
            "    Resize(size=64, interpolation=bilinear, max_size=None, antialias=True)\n"
            "    RandomCrop(size=(64, 64), padding=8)\n"
            "    RandomHorizontalFlip(p=0.5)\n"
            "    ToTensor()\n"
            "    Normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])\n"
            ")");

  AugmentOptions heavy{"heavy", 224, {}, {}};  // no normalisation
  EXPECT_EQ(make_train_transform(heavy, 0, 0)->describe(),
            "Compose(\n"
            "    RandomResizedCrop(size=(224, 224), scale=(0.08, 1.0), ratio=(0.75, 1.3333), "
            "interpolation=bilinear, antialias=True)\n"
            "    RandomHorizontalFlip(p=0.5)\n"
            "    RandomVerticalFlip(p=0.5)\n"
            "    RandomRotation(degrees=[-45.0, 45.0], interpolation=nearest, expand=False, fill=0)\n"
            "    RandomAffine(degrees=[-45.0, 45.0])\n"
            "    ColorJitter(brightness=None, contrast=None, saturation=None, hue=None)\n"
            "    ToTensor()\n"
            ")");
  EXPECT_EQ(make_eval_transform(heavy, 0, 0)->describe(),
            "Compose(\n"
            "    Resize(size=256, interpolation=bilinear, max_size=None, antialias=True)\n"
            "    CenterCrop(size=(224, 224))\n"
            "    ToTensor()\n"
            ")");

  AugmentOptions none{"none", 48, kMean, kStd};  // images of any size
  EXPECT_EQ(make_train_transform(none, 0, 0)->describe(),
            "Compose(\n"
            "    Resize(size=48, interpolation=bilinear, max_size=None, antialias=True)\n"
            "    CenterCrop(size=(48, 48))\n"
            "    ToTensor()\n"
            "    Normalize(mean=[0.5, 0.4, 0.3], std=[0.2, 0.25, 0.3])\n"
            ")");
}

TEST(AugmentTest, OutputShapesMatchOutputSize) {
  struct Setup {
    std::string name;
    int64_t image_size, height, width;
  };
  for (const auto& s : std::vector<Setup>{{"none", 0, 32, 32},
                                          {"none", 24, 37, 53},
                                          {"cifar", 0, 32, 32},
                                          {"cifar", 40, 32, 32},
                                          {"cifar", 20, 37, 53},
                                          {"imagenet", 0, 37, 53},
                                          {"imagenet", 32, 37, 53},
                                          {"heavy", 28, 28, 28}}) {
    AugmentOptions o{s.name, s.image_size, kMean, kStd};
    auto image = bytes({3, s.height, s.width});
    auto size = augment_output_size(o, s.height, s.width);
    std::vector<int64_t> expected = {3, size[0], size[1]};
    EXPECT_EQ(output_shape(make_train_transform(o, s.height, s.width), image), expected)
        << s.name << " " << s.image_size;
    EXPECT_EQ(output_shape(make_eval_transform(o, s.height, s.width), image), expected)
        << s.name << " " << s.image_size;
  }
  // Grey images through a preset without colour normalisation.
  AugmentOptions gray{"heavy", 16, {0.3}, {0.2}};
  EXPECT_EQ(output_shape(make_train_transform(gray, 28, 28), bytes({1, 28, 28})),
            (std::vector<int64_t>{1, 16, 16}));
  // The eval size of the ImageNet recipe: round(32 * 256 / 224) = 37, crop 32.
  AugmentOptions imagenet{"imagenet", 32, kMean, kStd};
  EXPECT_NE(make_eval_transform(imagenet, 0, 0)->describe().find("Resize(size=37,"), std::string::npos);
}

TEST(AugmentTest, Errors) {
  AugmentOptions bad{"fancy", 0, {}, {}};
  EXPECT_EQ(error_of([&] { make_train_transform(bad, 32, 32); }),
            "--augment: expected one of none, cifar, imagenet, heavy, got 'fancy'");
  AugmentOptions sizeless{"imagenet", 0, {}, {}};
  EXPECT_NE(error_of([&] { make_eval_transform(sizeless, 0, 0); }).find("--image-size is required"),
            std::string::npos);
  AugmentOptions uneven{"none", 0, {0.5}, {0.2, 0.3}};
  EXPECT_NE(error_of([&] { make_train_transform(uneven, 8, 8); }).find("same number of values"),
            std::string::npos);
}

// Each message names the transform and says what it expected.
TEST(TransformErrorTest, MessagesNameTheTransformAndTheExpectation) {
  SampleRng rng(0, 0, 0);
  auto image = bytes({3, 10, 12});
  auto expect_error = [](const std::string& message, const std::string& part) {
    EXPECT_NE(message.find(part), std::string::npos) << "message: " << message;
  };
  expect_error(error_of([&] { Normalize({{0.5}, {0.2}}).apply(image, rng); }),
               "Normalize: expected a float32 image (apply ToTensor first), got Byte");
  expect_error(error_of([&] { Normalize({{0.5, 0.5}, {0.2, 0.2}}).apply(image.to(torch::kFloat32), rng); }),
               "Normalize: mean and std have 2 values but the image has 3 channels");
  expect_error(error_of([&] { Normalize({{0.5}, {0.0}}); }), "Normalize: std must not be 0");
  expect_error(error_of([&] { ToTensor().apply(image.to(torch::kFloat32), rng); }),
               "ToTensor: expected a uint8 image, got Float");
  expect_error(error_of([&] { F::adjust_hue(bytes({2, 4, 4}), 0.1); }),
               "adjust_hue: expected an image with 1 or 3 channels, got 2");
  expect_error(error_of([&] { F::adjust_hue(image, 0.7); }),
               "adjust_hue: hue_factor must be in [-0.5, 0.5], got 0.7");
  expect_error(error_of([&] { F::adjust_brightness(image, -1); }),
               "adjust_brightness: brightness_factor must be >= 0");
  expect_error(error_of([&] { F::hflip(bytes({10, 12})); }),
               "hflip: expected an image tensor [C, H, W], got [10, 12]");
  expect_error(error_of([&] { F::vflip(image.to(torch::kInt32)); }),
               "vflip: expected a uint8 or float32 image, got Int");
  expect_error(error_of([&] { F::pad(image, {1, 2, 3}); }),
               "pad: padding must have 1, 2 or 4 values (left, top, right, bottom), got 3");
  expect_error(error_of([&] { F::pad(image, {1, 2}, {1, 2}); }),
               "pad: fill must have 1 value or one per channel (3), got 2");
  expect_error(error_of([&] { F::pad(image, {12}, {0}, PaddingMode::kReflect); }),
               "pad: reflect padding must be smaller than the image (10x12)");
  GridOptions grid;
  grid.fill = std::vector<double>{1, 2};
  expect_error(error_of([&] { F::rotate(image, 10, grid); }),
               "rotate: fill must have 1 value or one per channel (3), got 2");
  expect_error(error_of([&] { Resize(ResizeOptions{}); }),
               "Resize: size must be one value (the smaller edge) or two (height, width), got 0");
  RandomCropOptions crop;
  crop.size = {16};
  expect_error(error_of([&] { RandomCrop(crop).apply(image, rng); }),
               "RandomCrop: crop size (16, 16) is larger than the image size (10, 12)");
  RandomResizedCropOptions rrc;
  rrc.size = {8};
  rrc.scale = {0.5, 0.1};
  expect_error(error_of([&] { RandomResizedCrop{rrc}; }),
               "RandomResizedCrop: scale must be (min, max) with 0 <= min <= max, max > 0, got (0.5, 0.1)");
  ColorJitterOptions jitter;
  jitter.hue = {0.6};
  expect_error(error_of([&] { ColorJitter{jitter}; }),
               "ColorJitter: hue must lie in [-0.5, 0.5] as (min, max) with min <= max, got (-0.6, 0.6)");
  RandomRotationOptions rotation;
  expect_error(error_of([&] { RandomRotation{rotation}; }),
               "RandomRotation: degrees must be one value or (min, max), got 0 values");
  RandomAffineOptions affine;
  affine.degrees = {5};
  affine.translate = std::array<double, 2>{0.5, 1.5};
  expect_error(error_of([&] { RandomAffine{affine}; }),
               "RandomAffine: translate values must be in [0, 1], got (0.5, 1.5)");
  FlipOptions flip;
  flip.p = 2;
  expect_error(error_of([&] { RandomHorizontalFlip{flip}; }),
               "RandomHorizontalFlip: p must be in [0, 1], got 2.0");
}

}  // namespace
}  // namespace tandem::data
