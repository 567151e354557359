// The deterministic transforms against torchvision itself: one table of
// cases (op + parameters as JSON) is run here through
// tandem::data::functional and by tests/data/transforms_reference.py through
// torchvision.transforms.v2.functional, on the same images; every output
// must be equal bit for bit (same dtype, shape and values).
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>
#include <torch/serialize.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>

#include "tandem/data/transforms.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::data {
namespace {

using nlohmann::json;
namespace F = functional;

// Fixed inputs: odd sizes, 3 and 1 channels, uint8 and float32.
std::map<std::string, torch::Tensor> make_images() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(20240611);
  auto bytes = [&](std::vector<int64_t> shape) {
    return torch::randint(0, 256, shape, gen, torch::kInt64).to(torch::kUInt8);
  };
  std::map<std::string, torch::Tensor> images;
  images["rgb"] = bytes({3, 37, 53});
  images["gray"] = bytes({1, 41, 29});
  images["square"] = bytes({3, 32, 32});
  // Smooth content (gradients plus a little noise), where interpolation
  // and colour conversions round differently than on noise.
  auto y = torch::arange(45, torch::kFloat32).view({1, 45, 1}).expand({1, 45, 61});
  auto x = torch::arange(61, torch::kFloat32).view({1, 1, 61}).expand({1, 45, 61});
  auto base = torch::cat({x * 4, y * 5, (x + y) * 2}, 0).clamp(0, 235);
  images["smooth"] = (base + torch::randint(0, 20, {3, 45, 61}, gen, torch::kInt64)).to(torch::kUInt8);
  images["rgb_float"] = images["rgb"].to(torch::kFloat32) / 255;
  images["gray_float"] = images["gray"].to(torch::kFloat32) / 255;
  return images;
}

struct Case {
  std::string name, image;
  json args;
};

std::vector<Case> make_cases() {
  std::vector<Case> cases;
  auto add = [&](const std::string& image, json args) {
    std::string name = args["op"].get<std::string>() + "/" + image + "/" + args.dump();
    cases.push_back({name, image, std::move(args)});
  };
  auto resize = [](json size, std::string mode, bool antialias) {
    return json{{"op", "resize"}, {"size", size}, {"interpolation", mode}, {"antialias", antialias}};
  };
  for (const char* image : {"rgb", "gray", "smooth", "rgb_float"}) {
    add(image, resize({20}, "bilinear", true));       // down, smaller edge
    add(image, resize({64}, "bilinear", true));       // up
    add(image, resize({17, 80}, "bilinear", true));   // down and up
    add(image, resize({20}, "bilinear", false));
    add(image, resize({50, 70}, "bilinear", false));
    add(image, resize({20}, "nearest", true));
    add(image, resize({50, 70}, "nearest", false));
  }
  add("rgb", resize({37, 53}, "bilinear", true));  // same size: the input
  auto capped = resize({20}, "bilinear", true);
  capped["max_size"] = 25;
  add("rgb", capped);
  for (json size : {json{24}, json{13, 90}}) {
    auto hwc = resize(size, "bilinear", true);
    hwc["channels_last"] = true;
    add("smooth", hwc);
    add("rgb", hwc);
  }
  add("smooth", {{"op", "resized_crop"}, {"top", 3}, {"left", 9}, {"height", 30}, {"width", 41},
                 {"size", {24, 24}}, {"interpolation", "bilinear"}, {"antialias", true}});
  // A box of an HWC image: a channels-last view whose rows are wider than
  // the box, as a crop of a decoded image is (Note [resize a contiguous box]).
  for (json size : {json{24, 24}, json{50, 61}}) {
    for (bool antialias : {true, false}) {
      for (const char* image : {"rgb", "smooth"}) {
        add(image, {{"op", "resized_crop"}, {"top", 3}, {"left", 9}, {"height", 30}, {"width", 41},
                    {"size", size}, {"interpolation", "bilinear"}, {"antialias", antialias},
                    {"channels_last", true}});
      }
    }
  }

  for (const char* image : {"rgb", "gray"}) {
    for (auto box : std::vector<std::array<int, 4>>{{5, 7, 20, 21}, {-3, -4, 20, 30}, {30, 20, 20, 40}}) {
      add(image, {{"op", "crop"}, {"top", box[0]}, {"left", box[1]}, {"height", box[2]},
                  {"width", box[3]}});
    }
    for (json size : {json{20}, json{20, 31}, json{40, 60}, json{50, 20}, json{41, 29}}) {
      add(image, {{"op", "center_crop"}, {"size", size}});
    }
    add(image, {{"op", "hflip"}});
    add(image, {{"op", "vflip"}});
  }

  auto pad = [](json padding, json fill, std::string mode) {
    return json{{"op", "pad"}, {"padding", padding}, {"fill", fill}, {"padding_mode", mode}};
  };
  for (const char* image : {"rgb", "gray", "rgb_float"}) {
    add(image, pad({3}, {0}, "constant"));
    add(image, pad({2, 5}, {7.6}, "constant"));
    for (const char* mode : {"edge", "reflect", "symmetric"}) {
      add(image, pad({1, 2, 3, 4}, {0}, mode));
      add(image, pad({5}, {0}, mode));
    }
  }
  add("rgb", pad({1, 2, 3, 4}, {10, 20, 250.7}, "constant"));
  add("rgb_float", pad({2, 0, 1, 3}, {0.25, 0.5, 0.75}, "constant"));

  auto rotate = [](double angle, std::string mode, json fill) {
    return json{{"op", "rotate"}, {"angle", angle}, {"interpolation", mode},
                {"expand", false}, {"fill", fill}};
  };
  for (const char* image : {"rgb", "gray", "smooth", "rgb_float"}) {
    for (double angle : {30.0, -45.0, 90.0, 123.4}) {
      add(image, rotate(angle, "nearest", {0}));
      add(image, rotate(angle, "bilinear", {0}));
    }
    add(image, rotate(17.0, "bilinear", nullptr));  // fill=None: no mask
    add(image, rotate(-200.0, "nearest", {9}));
    add(image, rotate(61.0, "bilinear", {7}));
  }
  add("rgb", rotate(15.0, "nearest", {255, 0, 128}));
  add("rgb", rotate(15.0, "bilinear", {255, 0, 128}));
  for (double angle : {0.0, 90.0, 180.0, 270.0, 360.0, -90.0}) add("square", rotate(angle, "nearest", {0}));
  add("rgb", rotate(180.0, "bilinear", {0}));
  for (const char* mode : {"nearest", "bilinear"}) {
    auto expanded = rotate(30.0, mode, {0});
    expanded["expand"] = true;
    add("rgb", expanded);
    add("gray", expanded);
    expanded["angle"] = 90.0;
    add("rgb", expanded);
    auto centred = rotate(20.0, mode, {0});
    centred["center"] = {5.0, 10.5};
    add("rgb", centred);
  }

  auto affine = [](double angle, json translate, double scale, json shear, std::string mode,
                   json fill) {
    return json{{"op", "affine"}, {"angle", angle}, {"translate", translate}, {"scale", scale},
                {"shear", shear}, {"interpolation", mode}, {"fill", fill}};
  };
  for (const char* image : {"rgb", "gray", "smooth", "rgb_float"}) {
    for (const char* mode : {"nearest", "bilinear"}) {
      add(image, affine(20.0, {3, -2}, 1.1, {10.0, 0.0}, mode, {0}));
      add(image, affine(-33.3, {0, 0}, 0.8, {5.0, -8.0}, mode, {0}));
      add(image, affine(0.0, {-4, 7}, 1.0, {0.0, 0.0}, mode, {0}));
      add(image, affine(12.0, {1, 1}, 1.3, {-20.0, 15.0}, mode, nullptr));
    }
  }
  auto centred = affine(25.0, {2, 3}, 0.9, {4.0, 2.0}, "bilinear", {1, 2, 3});
  centred["center"] = {10.0, 12.0};
  add("rgb", centred);

  for (const char* image : {"rgb", "gray", "smooth", "rgb_float", "gray_float"}) {
    for (double f : {0.0, 0.5, 1.7}) add(image, {{"op", "adjust_brightness"}, {"factor", f}});
    for (double f : {0.0, 0.3, 1.8}) add(image, {{"op", "adjust_contrast"}, {"factor", f}});
    for (double f : {0.0, 0.4, 2.0}) add(image, {{"op", "adjust_saturation"}, {"factor", f}});
    for (double f : {-0.5, -0.2, 0.0, 0.1, 0.37, 0.5}) add(image, {{"op", "adjust_hue"}, {"factor", f}});
  }
  for (const char* image : {"rgb", "gray", "smooth"}) add(image, {{"op", "to_tensor"}});
  add("rgb_float", {{"op", "normalize"}, {"mean", {0.485, 0.456, 0.406}}, {"std", {0.229, 0.224, 0.225}}});
  add("gray_float", {{"op", "normalize"}, {"mean", {0.2860}}, {"std", {0.3530}}});
  add("rgb_float", {{"op", "normalize"}, {"mean", {0.5}}, {"std", {0.25}}});
  return cases;
}

InterpolationMode mode_of(const json& a) {
  return a["interpolation"] == "nearest" ? InterpolationMode::kNearest : InterpolationMode::kBilinear;
}

GridOptions grid_of(const json& a) {
  GridOptions o;
  o.interpolation = mode_of(a);
  if (!a["fill"].is_null()) o.fill = a["fill"].get<std::vector<double>>();
  if (a.contains("center")) o.center = a["center"].get<std::array<double, 2>>();
  o.expand = a.value("expand", false);
  return o;
}

// The same cases through tandem.
torch::Tensor ours(torch::Tensor image, const json& a) {
  std::string op = a["op"];
  if (a.value("channels_last", false)) image = image.permute({1, 2, 0}).contiguous().permute({2, 0, 1});
  if (op == "resize" || op == "resized_crop") {
    ResizeOptions o;
    o.size = a["size"].get<std::vector<int64_t>>();
    o.interpolation = mode_of(a);
    o.antialias = a["antialias"];
    if (a.contains("max_size")) o.max_size = a["max_size"].get<int64_t>();
    if (op == "resized_crop") image = F::crop(image, a["top"], a["left"], a["height"], a["width"]);
    return F::resize(image, o);
  }
  if (op == "crop") return F::crop(image, a["top"], a["left"], a["height"], a["width"]);
  if (op == "center_crop") return F::center_crop(image, a["size"].get<std::vector<int64_t>>());
  if (op == "pad") {
    std::string m = a["padding_mode"];
    PaddingMode mode = m == "constant" ? PaddingMode::kConstant
                       : m == "edge"   ? PaddingMode::kEdge
                       : m == "reflect" ? PaddingMode::kReflect
                                        : PaddingMode::kSymmetric;
    return F::pad(image, a["padding"].get<std::vector<int64_t>>(),
                  a["fill"].get<std::vector<double>>(), mode);
  }
  if (op == "hflip") return F::hflip(image);
  if (op == "vflip") return F::vflip(image);
  if (op == "rotate") return F::rotate(image, a["angle"], grid_of(a));
  if (op == "affine") {
    AffineParams p;
    p.angle = a["angle"];
    p.translate = a["translate"].get<std::array<double, 2>>();
    p.scale = a["scale"];
    p.shear = a["shear"].get<std::array<double, 2>>();
    return F::affine(image, p, grid_of(a));
  }
  if (op == "adjust_brightness") return F::adjust_brightness(image, a["factor"]);
  if (op == "adjust_contrast") return F::adjust_contrast(image, a["factor"]);
  if (op == "adjust_saturation") return F::adjust_saturation(image, a["factor"]);
  if (op == "adjust_hue") return F::adjust_hue(image, a["factor"]);
  if (op == "to_tensor") return F::to_tensor(image);
  if (op == "normalize") {
    return F::normalize(image, a["mean"].get<std::vector<double>>(), a["std"].get<std::vector<double>>());
  }
  TANDEM_FAIL("unknown op ", op);
}

// Runs the reference script once for all tests of this file.
struct Reference {
  std::map<std::string, torch::Tensor> images;
  std::vector<Case> cases;
  std::map<std::string, torch::Tensor> expected;
  std::string error;  // non-empty if the script failed
};

const Reference& reference() {
  static const Reference ref = [] {
    Reference r;
    r.images = make_images();
    r.cases = make_cases();
    testing::TempDir dir;
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& [name, image] : r.images) dict.insert(name, image);
    auto bytes = torch::pickle_save(dict);
    std::ofstream(dir.file("images.pt"), std::ios::binary).write(bytes.data(), bytes.size());
    json list = json::array();
    for (const auto& c : r.cases) list.push_back({{"name", c.name}, {"image", c.image}, {"args", c.args}});
    std::ofstream(dir.file("cases.json")) << list.dump();
    auto result = testing::run(std::string(TANDEM_PYTHON) + " " + TANDEM_SOURCE_DIR +
                               "/tests/data/transforms_reference.py " + dir.file("images.pt") +
                               " " + dir.file("cases.json") + " " + dir.file("out.pt"));
    if (result.exit_code != 0) {
      r.error = result.output;
      return r;
    }
    std::ifstream in(dir.file("out.pt"), std::ios::binary);
    std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (const auto& entry : torch::pickle_load(data).toGenericDict()) {
      r.expected[entry.key().toStringRef()] = entry.value().toTensor();
    }
    return r;
  }();
  return ref;
}

// Checks every case of `op` against torchvision.
void check_op(const std::string& op) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << "reference script failed:\n" << ref.error;
  for (const auto& c : ref.cases) {
    if (c.args["op"] != op) continue;
    const auto& theirs = ref.expected.at(c.name);
    auto mine = ours(ref.images.at(c.image), c.args);
    ASSERT_EQ(mine.scalar_type(), theirs.scalar_type()) << c.name;
    ASSERT_EQ(mine.sizes(), theirs.sizes()) << c.name;
    if (torch::equal(mine, theirs)) continue;
    auto diff = (mine.to(torch::kFloat64) - theirs.to(torch::kFloat64)).abs();
    int64_t differ = (diff > 0).sum().item<int64_t>();
    double most = diff.max().item<double>();
    // Where this CPU's bmm rounds torchvision's grid otherwise than plain
    // float32 arithmetic (transforms_reference.py), a sample may land an ulp
    // away: float values within 1e-5 of the image's largest value (a fill
    // may exceed 1), uint8 within 1 on at most 1% of them.
    auto flag = ref.expected.find("#grid_exact/" + c.name);
    bool grid_rounding = flag != ref.expected.end() && !flag->second.item<bool>();
    bool small = mine.scalar_type() == torch::kUInt8 ? most <= 1 && differ * 100 <= diff.numel()
                                                      : most <= 1e-5 * std::max(1.0, theirs.abs().max().item<double>());
    if (grid_rounding && small) {
      std::printf("%s: torchvision's grid rounds otherwise on this CPU; %lld of %lld values differ, "
                  "by at most %g\n", c.name.c_str(), static_cast<long long>(differ),
                  static_cast<long long>(diff.numel()), most);
      continue;
    }
    ADD_FAILURE() << c.name << ": " << differ << " of " << diff.numel() << " values differ, by at most "
                  << most << (grid_rounding ? " (torchvision's grid rounds otherwise on this CPU)" : "");
  }
}

// One test, so that ctest (a process per test) runs the Python script once.
// A failure names the case: op, image and parameters.
TEST(TransformExactTest, EqualsTorchvisionBitForBit) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << "reference script failed:\n" << ref.error;
  std::map<std::string, int> per_op;
  for (const auto& c : ref.cases) {
    ASSERT_EQ(ref.expected.count(c.name), 1u) << c.name;
    per_op[c.args["op"].get<std::string>()]++;
  }
  int64_t outputs = 0;
  for (const auto& entry : ref.expected) outputs += entry.first.rfind("#", 0) == 0 ? 0 : 1;
  EXPECT_EQ(outputs, static_cast<int64_t>(ref.cases.size()));
  for (const char* op : {"resize", "resized_crop", "crop", "center_crop", "pad", "hflip", "vflip",
                         "rotate", "affine", "adjust_brightness", "adjust_contrast",
                         "adjust_saturation", "adjust_hue", "to_tensor", "normalize"}) {
    SCOPED_TRACE(op);
    EXPECT_GT(per_op[op], 0);
    check_op(op);
  }
  std::cout << ref.cases.size() << " cases:";
  for (const auto& [op, n] : per_op) std::cout << " " << op << " " << n;
  std::cout << "\n";
}

}  // namespace
}  // namespace tandem::data
