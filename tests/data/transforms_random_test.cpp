// SampleRng, the random transforms' parameter draws, Compose, the --augment
// presets and the transforms' error messages.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "tandem/data/augment.h"
#include "tandem/data/transforms.h"
#include "tandem/util/check.h"

namespace tandem::data {
namespace {

namespace F = functional;

torch::Tensor test_image(std::vector<int64_t> shape, uint64_t seed = 7) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(0, 256, shape, gen, torch::kInt64).to(torch::kUInt8);
}

// ---- SampleRng ---------------------------------------------------------------------

TEST(SampleRngTest, SameKeySameStreamOtherKeysOtherStreams) {
  SampleRng a(1, 2, 3), b(1, 2, 3);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.next_u64(), b.next_u64());
  std::set<uint64_t> firsts;
  for (auto [seed, epoch, index] : std::vector<std::array<int64_t, 3>>{
           {1, 2, 3}, {0, 2, 3}, {1, 0, 3}, {1, 2, 0}, {1, 3, 2}, {2, 1, 3}, {3, 2, 1}}) {
    firsts.insert(SampleRng(seed, epoch, index).next_u64());
  }
  EXPECT_EQ(firsts.size(), 7u);  // permuted keys are different keys
}

TEST(SampleRngTest, UniformRandintBernoulliHaveTheirDistributions) {
  SampleRng rng(42, 0, 0);
  const int n = 20000;
  double sum = 0, lo = 1e9, hi = -1e9;
  std::vector<int> counts(7, 0);
  int heads = 0;
  for (int i = 0; i < n; ++i) {
    double u = rng.uniform(-2.0, 3.0);
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    int64_t k = rng.randint(-3, 3);
    ASSERT_GE(k, -3);
    ASSERT_LE(k, 3);
    counts[k + 3]++;
    heads += rng.bernoulli(0.3);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.05);
  EXPECT_GE(lo, -2.0);
  EXPECT_LT(hi, 3.0);
  EXPECT_LT(lo, -1.99);
  EXPECT_GT(hi, 2.99);
  for (int c : counts) EXPECT_NEAR(c, n / 7.0, n / 7.0 * 0.08);
  EXPECT_NEAR(heads / double(n), 0.3, 0.015);
  EXPECT_EQ(rng.uniform(5.0, 5.0), 5.0);
  EXPECT_EQ(rng.randint(4, 4), 4);
  EXPECT_THROW(rng.randint(2, 1), Error);
}

// ---- parameter draws -------------------------------------------------------------

TEST(TransformRandomTest, RandomResizedCropAreaAndRatioWithinBounds) {
  const int64_t h = 400, w = 400;
  std::array<double, 2> scale = {0.08, 1.0}, ratio = {3.0 / 4.0, 4.0 / 3.0};
  double min_area = 1, max_area = 0, min_ratio = 10, max_ratio = 0;
  int wide = 0;
  const int n = 4000;
  for (int i = 0; i < n; ++i) {
    SampleRng rng(5, 0, i);
    auto box = RandomResizedCrop::get_params(rng, h, w, scale, ratio);
    ASSERT_GE(box.top, 0);
    ASSERT_GE(box.left, 0);
    ASSERT_LE(box.top + box.height, h);
    ASSERT_LE(box.left + box.width, w);
    double area = double(box.height * box.width) / (h * w);
    double r = double(box.width) / box.height;
    // Rounding the edges to whole pixels moves area and ratio by < 1%.
    EXPECT_GE(area, scale[0] * 0.99);
    EXPECT_LE(area, scale[1]);
    EXPECT_GE(r, ratio[0] * 0.99);
    EXPECT_LE(r, ratio[1] * 1.01);
    min_area = std::min(min_area, area);
    max_area = std::max(max_area, area);
    min_ratio = std::min(min_ratio, r);
    max_ratio = std::max(max_ratio, r);
    wide += r > 1;
  }
  EXPECT_LT(min_area, 0.09);
  EXPECT_GT(max_area, 0.95);
  EXPECT_LT(min_ratio, 0.77);
  EXPECT_GT(max_ratio, 1.30);
  // Log-uniform ratio on a square image: as many wide crops as tall ones.
  EXPECT_NEAR(wide / double(n), 0.5, 0.04);
}

TEST(TransformRandomTest, RandomResizedCropFallsBackToTheCentralCrop) {
  SampleRng rng(1, 0, 0);
  std::array<double, 2> ratio = {3.0 / 4.0, 4.0 / 3.0};
  // No 3/4..4/3 box of 90%+ of a 10x100 image fits: ratio clamped to 4/3.
  auto wide = RandomResizedCrop::get_params(rng, 10, 100, {0.9, 1.0}, ratio);
  EXPECT_EQ((std::array<int64_t, 4>{wide.top, wide.left, wide.height, wide.width}),
            (std::array<int64_t, 4>{0, 43, 10, 13}));
  auto tall = RandomResizedCrop::get_params(rng, 100, 10, {0.9, 1.0}, ratio);
  EXPECT_EQ((std::array<int64_t, 4>{tall.top, tall.left, tall.height, tall.width}),
            (std::array<int64_t, 4>{43, 0, 13, 10}));
  // More than the whole area never fits: the whole image.
  auto whole = RandomResizedCrop::get_params(rng, 20, 24, {1.5, 2.0}, ratio);
  EXPECT_EQ((std::array<int64_t, 4>{whole.top, whole.left, whole.height, whole.width}),
            (std::array<int64_t, 4>{0, 0, 20, 24}));
}

TEST(TransformRandomTest, FlipsHappenWithProbabilityP) {
  for (double p : {0.0, 0.25, 0.5, 1.0}) {
    int flips = 0;
    const int n = 8000;
    for (int i = 0; i < n; ++i) {
      SampleRng rng(3, 1, i);
      flips += RandomHorizontalFlip::get_params(rng, p).flip;
    }
    EXPECT_NEAR(flips / double(n), p, 0.02) << "p=" << p;
  }
  auto image = test_image({3, 5, 7});
  RandomHorizontalFlip always({/*p=*/1.0});
  RandomVerticalFlip never({/*p=*/0.0});
  SampleRng rng(0, 0, 0);
  EXPECT_TRUE(torch::equal(always.apply(image, rng), image.flip(2)));
  EXPECT_TRUE(torch::equal(never.apply(image, rng), image));
}

TEST(TransformRandomTest, RotationAndAffineDrawWithinTheirRanges) {
  double lo = 1e9, hi = -1e9;
  for (int i = 0; i < 3000; ++i) {
    SampleRng rng(9, 0, i);
    double angle = RandomRotation::get_params(rng, {-45.0, 45.0}).angle;
    lo = std::min(lo, angle);
    hi = std::max(hi, angle);
  }
  EXPECT_GE(lo, -45.0);
  EXPECT_LT(hi, 45.0);
  EXPECT_LT(lo, -44.0);
  EXPECT_GT(hi, 44.0);

  RandomAffineOptions o;
  o.degrees = {10, 20};
  o.translate = std::array<double, 2>{0.1, 0.2};
  o.scale = std::array<double, 2>{0.8, 1.2};
  o.shear = {-5, 5, 1, 2};
  for (int i = 0; i < 1000; ++i) {
    SampleRng rng(9, 1, i);
    auto p = RandomAffine::get_params(rng, /*height=*/40, /*width=*/50, o);
    ASSERT_GE(p.angle, 10);
    ASSERT_LT(p.angle, 20);
    ASSERT_EQ(p.translate[0], std::round(p.translate[0]));  // whole pixels
    ASSERT_LE(std::abs(p.translate[0]), 5);
    ASSERT_LE(std::abs(p.translate[1]), 8);
    ASSERT_GE(p.scale, 0.8);
    ASSERT_LT(p.scale, 1.2);
    ASSERT_GE(p.shear[0], -5);
    ASSERT_LT(p.shear[0], 5);
    ASSERT_GE(p.shear[1], 1);
    ASSERT_LT(p.shear[1], 2);
  }
  RandomAffineOptions plain;
  plain.degrees = {30};
  SampleRng rng(0, 0, 0);
  auto p = RandomAffine::get_params(rng, 10, 10, plain);
  EXPECT_EQ(p.translate, (std::array<double, 2>{0, 0}));
  EXPECT_EQ(p.scale, 1.0);
  EXPECT_EQ(p.shear, (std::array<double, 2>{0, 0}));
}

TEST(TransformRandomTest, RandomCropCoversEveryOffsetAndEqualsPadThenCrop) {
  RandomCropOptions o;
  o.size = {32};
  o.padding = {4};
  std::set<int64_t> tops, lefts;
  for (int i = 0; i < 2000; ++i) {
    SampleRng rng(2, 0, i);
    auto p = RandomCrop::get_params(rng, 32, 32, o);
    EXPECT_EQ(p.padding, (std::array<int64_t, 4>{4, 4, 4, 4}));
    tops.insert(p.box.top);
    lefts.insert(p.box.left);
  }
  EXPECT_EQ(tops.size(), 9u);  // 0..8
  EXPECT_EQ(*tops.rbegin(), 8);
  EXPECT_EQ(lefts.size(), 9u);

  // apply() crops without padding first when the fill is zero; it must equal
  // torchvision's pad-then-crop, for every padding mode.
  auto image = test_image({3, 32, 32});
  for (auto mode : {PaddingMode::kConstant, PaddingMode::kEdge, PaddingMode::kReflect,
                    PaddingMode::kSymmetric}) {
    for (std::vector<double> fill : {std::vector<double>{0}, std::vector<double>{9}}) {
      o.padding_mode = mode;
      o.fill = fill;
      RandomCrop crop(o);
      for (int i = 0; i < 20; ++i) {
        SampleRng a(4, 0, i), b(4, 0, i);
        auto p = RandomCrop::get_params(b, 32, 32, o);
        auto expected = F::crop(F::pad(image, {4}, fill, mode), p.box.top, p.box.left, 32, 32);
        ASSERT_TRUE(torch::equal(crop.apply(image, a), expected)) << to_string(mode);
      }
    }
  }

  RandomCropOptions small;
  small.size = {8, 10};
  small.pad_if_needed = true;
  SampleRng rng(0, 0, 0);
  auto p = RandomCrop::get_params(rng, 5, 12, small);
  EXPECT_EQ(p.padding, (std::array<int64_t, 4>{0, 3, 0, 3}));
  EXPECT_EQ(RandomCrop(small).apply(test_image({1, 5, 12}), rng).sizes(), (c10::IntArrayRef{1, 8, 10}));
}

TEST(TransformRandomTest, ColorJitterDrawsAPermutationAndFactorsInRange) {
  ColorJitterOptions o;
  o.brightness = {0.4};
  o.contrast = {0.5, 1.5};
  o.saturation = {0};  // no change
  o.hue = {0.1};
  ColorJitter jitter(o);
  EXPECT_EQ(jitter.describe(),
            "ColorJitter(brightness=(0.6, 1.4), contrast=(0.5, 1.5), saturation=None, hue=(-0.1, 0.1))");
  std::set<std::array<int, 4>> orders;
  for (int i = 0; i < 500; ++i) {
    SampleRng rng(1, 0, i);
    auto p = ColorJitter::get_params(rng, std::array<double, 2>{0.6, 1.4},
                                     std::array<double, 2>{0.5, 1.5}, std::nullopt,
                                     std::array<double, 2>{-0.1, 0.1});
    auto sorted = p.order;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted, (std::array<int, 4>{0, 1, 2, 3}));
    orders.insert(p.order);
    ASSERT_TRUE(p.brightness_factor && p.contrast_factor && p.hue_factor);
    ASSERT_FALSE(p.saturation_factor);
    ASSERT_GE(*p.brightness_factor, 0.6);
    ASSERT_LT(*p.brightness_factor, 1.4);
    ASSERT_GE(*p.hue_factor, -0.1);
    ASSERT_LT(*p.hue_factor, 0.1);
  }
  EXPECT_EQ(orders.size(), 24u);  // every order of the four occurs

  // apply() is the functional adjustments in the drawn order.
  auto image = test_image({3, 9, 11});
  SampleRng a(8, 0, 0), b(8, 0, 0);
  auto p = ColorJitter::get_params(b, std::array<double, 2>{0.6, 1.4},
                                   std::array<double, 2>{0.5, 1.5}, std::nullopt,
                                   std::array<double, 2>{-0.1, 0.1});
  auto expected = image;
  for (int id : p.order) {
    if (id == 0) expected = F::adjust_brightness(expected, *p.brightness_factor);
    if (id == 1) expected = F::adjust_contrast(expected, *p.contrast_factor);
    if (id == 3) expected = F::adjust_hue(expected, *p.hue_factor);
  }
  EXPECT_TRUE(torch::equal(jitter.apply(image, a), expected));

  // The defaults change nothing.
  ColorJitter identity;
  EXPECT_EQ(identity.describe(), "ColorJitter(brightness=None, contrast=None, saturation=None, hue=None)");
  EXPECT_TRUE(torch::equal(identity.apply(image, a), image));
}

// ---- determinism and Compose -----------------------------------------------------------

TEST(TransformRandomTest, SameKeySameImageOtherIndexOtherImage) {
  AugmentOptions o{"heavy", 24, {0.5, 0.5, 0.5}, {0.25, 0.25, 0.25}};
  auto pipeline = make_train_transform(o, 37, 53);
  auto image = test_image({3, 37, 53});
  auto run = [&](uint64_t seed, int64_t epoch, int64_t index) {
    SampleRng rng(seed, epoch, index);
    return pipeline->apply(image, rng);
  };
  auto first = run(1, 0, 5);
  EXPECT_EQ(first.sizes(), (c10::IntArrayRef{3, 24, 24}));
  EXPECT_EQ(first.scalar_type(), torch::kFloat32);
  EXPECT_TRUE(torch::equal(first, run(1, 0, 5)));
  EXPECT_FALSE(torch::equal(first, run(1, 0, 6)));
  EXPECT_FALSE(torch::equal(first, run(1, 1, 5)));
  EXPECT_FALSE(torch::equal(first, run(2, 0, 5)));
}

TEST(TransformRandomTest, ComposeAppliesInOrder) {
  auto image = test_image({3, 37, 53});
  ResizeOptions resize;
  resize.size = {20};
  auto crop_then_resize = Compose({std::make_shared<CenterCrop>(CenterCropOptions{{30}}),
                                   std::make_shared<Resize>(resize)});
  auto resize_then_crop = Compose({std::make_shared<Resize>(resize),
                                   std::make_shared<CenterCrop>(CenterCropOptions{{30}})});
  SampleRng rng(0, 0, 0);
  EXPECT_TRUE(torch::equal(crop_then_resize.apply(image, rng),
                           F::resize(F::center_crop(image, {30}), resize)));
  EXPECT_TRUE(torch::equal(resize_then_crop.apply(image, rng),
                           F::center_crop(F::resize(image, resize), {30})));
  EXPECT_EQ(crop_then_resize.describe(),
            "Compose(\n"
            "    CenterCrop(size=(30, 30))\n"
            "    Resize(size=20, interpolation=bilinear, max_size=None, antialias=True)\n"
            ")");
}

// Note [packed warp chains]: Compose moves the pixels of a uint8 image with
// two or three channels through runs of nearest-neighbour, zero-fill warps
// as one packed value. The reference is the same Compose applied to each
// channel on its own: a one-channel image is never packed, so it takes the
// unpacked path (uint8 -> float32, grid_sampler, back) warp by warp.
TEST(TransformRandomTest, PackedWarpRunsGiveTheBytesOfEachChannelWarpedAlone) {
  auto rotation = [](std::vector<double> degrees, std::vector<double> fill, bool expand,
                     InterpolationMode mode) {
    RandomRotationOptions o;
    o.degrees = std::move(degrees);
    o.fill = std::move(fill);
    o.expand = expand;
    o.interpolation = mode;
    return std::make_shared<RandomRotation>(o);
  };
  auto affine = [](std::vector<double> fill, InterpolationMode mode) {
    RandomAffineOptions o;
    o.degrees = {45};
    o.translate = std::array<double, 2>{0.1, 0.2};
    o.scale = std::array<double, 2>{0.8, 1.2};
    o.shear = {-10, 10, -5, 5};
    o.fill = std::move(fill);
    o.interpolation = mode;
    return std::make_shared<RandomAffine>(o);
  };
  const auto nearest = InterpolationMode::kNearest, bilinear = InterpolationMode::kBilinear;
  // Packed runs of one, two and three warps (a zero fill, none, a quarter
  // turn, a canvas that grows), split by a flip and by warps that cannot be
  // packed (bilinear; a fill that is not zero).
  Compose pipeline({rotation({45}, {0}, false, nearest), affine({}, nearest),
                    std::make_shared<RandomHorizontalFlip>(FlipOptions{0.5}),
                    rotation({90, 90}, {0}, false, nearest), rotation({30}, {}, true, nearest),
                    affine({0}, nearest), affine({0}, bilinear), rotation({20}, {7}, false, nearest),
                    rotation({60}, {0}, false, nearest)});
  for (int64_t channels : {2, 3}) {
    for (std::vector<int64_t> size : {std::vector<int64_t>{37, 53}, {24, 24}}) {
      auto image = test_image({channels, size[0], size[1]}, 100 + channels);
      for (int64_t index = 0; index < 20; ++index) {
        SampleRng rng(5, 0, index);
        auto packed = pipeline.apply(image, rng);
        std::vector<torch::Tensor> alone;
        for (int64_t c = 0; c < channels; ++c) {
          SampleRng same(5, 0, index);
          alone.push_back(pipeline.apply(image.slice(0, c, c + 1), same));
        }
        auto reference = torch::cat(alone);
        ASSERT_EQ(packed.scalar_type(), torch::kUInt8);
        ASSERT_TRUE(torch::equal(packed, reference))
            << channels << " channels, " << size[0] << "x" << size[1] << ", sample " << index
            << ": " << (packed != reference).sum().item<int64_t>() << " bytes differ";
      }
    }
  }
  // The single-warp functional form packs too (Note [packed nearest warp]).
  auto image = test_image({3, 37, 53}, 11);
  GridOptions zero;
  zero.fill = std::vector<double>{0, 0, 0};
  GridOptions zero1;
  zero1.fill = std::vector<double>{0};
  std::vector<torch::Tensor> alone;
  for (int64_t c = 0; c < 3; ++c) alone.push_back(F::rotate(image.slice(0, c, c + 1), 33.3, zero1));
  EXPECT_TRUE(torch::equal(F::rotate(image, 33.3, zero), torch::cat(alone)));
}

TEST(TransformRandomTest, APackableWarpWithAFillOfTheWrongSizeStillSaysSo) {
  RandomRotationOptions o;
  o.degrees = {10};
  o.fill = {0, 0};
  Compose pipeline({std::make_shared<RandomRotation>(o)});
  SampleRng rng(0, 0, 0);
  try {
    pipeline.apply(test_image({3, 10, 12}), rng);
    FAIL() << "a two-value fill on a three-channel image was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rotate: fill must have 1 value or one per channel (3), got 2"),
              std::string::npos)
        << e.what();
  }
}

// Note [tabulated finish]: Compose's result against each transform applied
// on its own, in order, which never tabulates (nor packs).
torch::Tensor one_by_one(const std::vector<TransformPtr>& list, const torch::Tensor& image,
                         SampleRng& rng) {
  auto out = image;
  for (const auto& t : list) out = t->apply(out, rng);
  return out;
}

TEST(TransformRandomTest, TabulatedFinishGivesTheValuesOfToTensorAndNormalize) {
  auto to_tensor = std::make_shared<ToTensor>();
  auto normalize3 = std::make_shared<Normalize>(NormalizeOptions{{0.485, 0.456, 0.406}, {0.229, 0.224, 0.225}});
  auto normalize1 = std::make_shared<Normalize>(NormalizeOptions{{0.5}, {0.25}});
  auto identity = std::make_shared<ColorJitter>();
  auto flip = std::make_shared<RandomHorizontalFlip>(FlipOptions{0.5});
  RandomRotationOptions ro;
  ro.degrees = {45};
  auto rotation = std::make_shared<RandomRotation>(ro);
  RandomAffineOptions ao;
  ao.degrees = {45};
  ao.translate = std::array<double, 2>{0.1, 0.1};
  auto affine = std::make_shared<RandomAffine>(ao);
  ColorJitterOptions jo;
  jo.brightness = {0.5};
  auto jitter = std::make_shared<ColorJitter>(jo);
  RandomRotationOptions bo = ro;
  bo.interpolation = InterpolationMode::kBilinear;
  auto bilinear = std::make_shared<RandomRotation>(bo);
  std::vector<std::pair<const char*, std::vector<TransformPtr>>> pipelines = {
      // seed 002's tail: a packed run, an identity, then the finish.
      {"heavy", {flip, rotation, affine, identity, to_tensor, normalize3}},
      {"packed, identities between", {rotation, identity, affine, identity, to_tensor, identity, normalize3}},
      {"packed, one-value normalize", {rotation, to_tensor, normalize1}},
      {"unpacked warp", {bilinear, to_tensor, normalize3}},
      {"planar", {flip, to_tensor, normalize3}},
      {"to_tensor alone", {flip, to_tensor}},
      {"packed, to_tensor alone", {affine, to_tensor}},
      {"to_tensor then float transforms", {to_tensor, jitter, normalize3}},
      {"normalize later", {to_tensor, flip, normalize3}},
  };
  // Every byte value in every channel, in a planar, a channels-last and a
  // cropped (strided) layout.
  auto every_byte = torch::arange(3 * 16 * 24, torch::kInt64).remainder(256).to(torch::kUInt8).view({3, 16, 24});
  auto hwc = test_image({20, 31, 3}, 3);
  std::vector<std::pair<const char*, torch::Tensor>> images = {
      {"planar", every_byte},
      {"channels-last", hwc.permute({2, 0, 1})},
      {"cropped", test_image({3, 40, 50}, 4).slice(1, 5, 30).slice(2, 7, 44)},
      {"two channels", test_image({2, 17, 19}, 5)},
      {"one channel", test_image({1, 17, 19}, 6)},
  };
  int compared = 0;
  for (const auto& [name, list] : pipelines) {
    Compose pipeline(list);
    for (const auto& [layout, image] : images) {
      bool three_values = std::find(list.begin(), list.end(), normalize3) != list.end();
      if (three_values && image.size(0) != 3) continue;
      for (int64_t index = 0; index < 8; ++index) {
        SampleRng a(9, 1, index), b(9, 1, index);
        auto got = pipeline.apply(image, a);
        auto want = one_by_one(list, image, b);
        ASSERT_EQ(got.scalar_type(), torch::kFloat32) << name << ", " << layout;
        ASSERT_TRUE(got.is_contiguous()) << name << ", " << layout;
        ASSERT_TRUE(torch::equal(got, want))
            << name << ", " << layout << ", sample " << index << ": "
            << (got != want).sum().item<int64_t>() << " values differ, most by "
            << (got - want).abs().max().item<float>();
        EXPECT_EQ(a.next_u64(), b.next_u64()) << name << ": the same draws";
        ++compared;
      }
    }
  }
  EXPECT_EQ(compared, 6 * 3 * 8 + 3 * 5 * 8);  // three-value normalize: 3-channel images only
}

TEST(TransformRandomTest, ATableThatDoesNotFitLeavesTheErrorToTheTransforms) {
  auto normalize3 = std::make_shared<Normalize>(NormalizeOptions{{0.5, 0.5, 0.5}, {0.2, 0.2, 0.2}});
  RandomRotationOptions ro;
  ro.degrees = {45};
  auto expect_error = [](const Compose& pipeline, const torch::Tensor& image, const std::string& text) {
    SampleRng rng(0, 0, 0);
    try {
      pipeline.apply(image, rng);
      FAIL() << "accepted; expected: " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  };
  Compose planar({std::make_shared<ToTensor>(), normalize3});
  Compose packed({std::make_shared<RandomRotation>(ro), std::make_shared<ToTensor>(), normalize3});
  const std::string channels = "Normalize: mean and std have 3 values but the image has 2 channels";
  expect_error(planar, test_image({2, 8, 8}), channels);
  expect_error(packed, test_image({2, 8, 8}), channels);
  expect_error(planar, torch::rand({3, 8, 8}), "ToTensor: expected a uint8 image, got Float");
  EXPECT_TRUE(ColorJitter().is_identity());
  ColorJitterOptions jo;
  jo.hue = {0.1};
  EXPECT_FALSE(ColorJitter(jo).is_identity());
}

}  // namespace
}  // namespace tandem::data
