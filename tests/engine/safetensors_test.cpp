#include <gtest/gtest.h>

#include <fstream>

#include "tandem/engine/safetensors.h"
#include "tandem/models/registry.h"
#include "tandem/util/table.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::engine {
namespace {

using testing::TempDir;

TEST(SafetensorsTest, RoundTripKeepsNamesDtypesShapesValuesAndMetadata) {
  TempDir dir;
  NamedTensors tensors = {{"w", torch::randn({3, 4})},
                          {"count", torch::tensor(int64_t{7})},
                          {"half", torch::randn({5}).to(torch::kBFloat16)},
                          {"mask", torch::tensor({true, false, true})},
                          {"strided", torch::randn({4, 6}).t()}};
  write_safetensors(dir.file("x.safetensors"), tensors, {{"producer", "tandem"}});
  auto file = read_safetensors(dir.file("x.safetensors"));
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    EXPECT_EQ(file.tensors[i].first, tensors[i].first);
    EXPECT_EQ(file.tensors[i].second.scalar_type(), tensors[i].second.scalar_type());
    EXPECT_TRUE(torch::equal(file.tensors[i].second, tensors[i].second)) << tensors[i].first;
  }
  EXPECT_EQ(file.metadata.at("producer"), "tandem");
  // The data starts 8-byte aligned, as the format asks.
  std::ifstream in(dir.file("x.safetensors"), std::ios::binary);
  uint64_t header_length = 0;
  in.read(reinterpret_cast<char*>(&header_length), 8);
  EXPECT_EQ(header_length % 8, 0u);
}

TEST(SafetensorsTest, DefectsAreNamedNotCrashed) {
  TempDir dir;
  auto path = dir.file("bad.safetensors");
  auto expect_error = [&](const std::string& bytes, const std::string& fragment) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), bytes.size());
    try {
      read_safetensors(path);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_NE(message.find(path), std::string::npos) << message;
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
    }
  };
  auto with_header = [](const std::string& json, size_t data_bytes) {
    std::string out(8, '\0');
    uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
    return out + json + std::string(data_bytes, '\0');
  };
  expect_error("abc", "shorter than its 8-byte header length");
  expect_error(std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8) + "{}", "exceeds the file");
  expect_error(with_header("{not json", 0), "not valid JSON");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
               "do not hold 8 bytes");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
               "data_offsets [0, 16]");
  expect_error(with_header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 8),
               "unsupported dtype");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 8),
               "bad dimension");
}

// The exported weights load into torchvision's resnet18 with strict name
// checking, through Python's safetensors package (the pinned wheels).
TEST(SafetensorsTest, ExportedResnetLoadsIntoTorchvision) {
  TempDir dir;
  models::ModelOptions o;
  o.num_classes = 1000;
  o.image_size = 224;
  auto model = models::make_model("resnet18", o);
  NamedTensors tensors;
  for (const auto& p : model->named_parameters()) tensors.emplace_back(p.key(), p.value());
  for (const auto& b : model->named_buffers()) tensors.emplace_back(b.key(), b.value());
  write_safetensors(dir.file("r18.safetensors"), tensors);
  std::string script = dir.file("check.py");
  std::ofstream(script) << "import sys, torch, torchvision\n"
                           "from safetensors.torch import load_file\n"
                           "state = load_file(sys.argv[1])\n"
                           "m = torchvision.models.resnet18()\n"
                           "m.load_state_dict(state, strict=True)\n"
                           "print('loaded', len(state), float(state['fc.weight'][0, 0]))\n";
  auto result = testing::run(std::string(TANDEM_PYTHON) + " " + script + " " +
                             dir.file("r18.safetensors"));
  ASSERT_EQ(result.exit_code, 0) << result.output;
  auto expected = format("loaded 122 %.6f", model->named_parameters()["fc.weight"][0][0].item<float>());
  EXPECT_NE(result.output.find(expected.substr(0, 16)), std::string::npos)
      << result.output << " vs " << expected;
}

}  // namespace
}  // namespace tandem::engine
