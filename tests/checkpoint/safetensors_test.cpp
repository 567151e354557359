#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/registry.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"
#include "testing.h"

namespace tandem::checkpoint {
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
  expect_error(std::string("PK\x03\x04\x14\x00\x00\x00", 8) + std::string(64, 'z'),
               ": a zip archive (a --checkpoint-dir checkpoint?), not a safetensors file");
  expect_error(with_header("{not json", 0), "not valid JSON");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8),
               "do not hold 8 bytes");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
               "data_offsets [0, 16]");
  expect_error(with_header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 8),
               "unsupported dtype");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 8),
               "bad dimension");
  // The format's layout: the tensors cover the data in order, no overlap,
  // gap or trailing bytes; a name once.
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
               "starts at byte 0 of the data, expected 4");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
               ": 4 bytes after the last tensor's data");
  expect_error(with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                           R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               ": tensor 'a' is named twice in the header");
  EXPECT_EQ(testing::error_of([&] { read_safetensors(dir.path()); }),
            dir.path() + ": is a folder; expected a safetensors file");
  // Writing into a folder that does not exist says why it cannot.
  EXPECT_NE(testing::error_of([&] { write_safetensors(dir.file("no-such-dir/w.st"), {{"a", torch::ones({1})}}); })
                .find(": cannot create: No such file or directory"),
            std::string::npos);
}

// Weights of an integer type for a float parameter would convert silently
// to nonsense, and NaN or infinite ones train or evaluate to NaN: both are
// refused, naming the tensor.
TEST(SafetensorsTest, LoadWeightsRefusesIntegerAndNonFiniteFloats) {
  TempDir dir;
  torch::nn::Linear model(2, 1);
  auto write = [&](const std::string& name, const torch::Tensor& weight) {
    write_safetensors(dir.file(name), {{"weight", weight}, {"bias", torch::zeros({1})}});
    return dir.file(name);
  };
  auto ints = write("ints.safetensors", torch::ones({1, 2}, torch::kInt32));
  EXPECT_EQ(testing::error_of([&] { load_weights(ints, *model); }),
            ints + ": tensor 'weight' is I32, the model's parameter is Float");
  auto nan = write("nan.safetensors", torch::tensor({{1.0f, std::nanf("")}}));
  EXPECT_EQ(testing::error_of([&] { load_weights(nan, *model); }),
            nan + ": tensor 'weight' holds NaN or infinite values");
  auto good = write("good.safetensors", torch::tensor({{1.0, 2.0}}, torch::kFloat64));  // float to float: fine
  load_weights(good, *model);
  EXPECT_TRUE(torch::equal(model->weight, torch::tensor({{1.0f, 2.0f}})));

  // BatchNorm: the step count may be an integer, as in PyTorch's state_dict
  // (torchvision's files); a negative running variance is refused.
  torch::nn::BatchNorm1d bn(2);
  bn->to(torch::kFloat32);  // tandem's models hold it as a float (libtorch converts every buffer)
  bn->num_batches_tracked.set_data(bn->num_batches_tracked.to(torch::kFloat32));
  auto bn_file = [&](const std::string& name, const torch::Tensor& var, const torch::Tensor& count) {
    write_safetensors(dir.file(name), {{"weight", torch::ones({2})}, {"bias", torch::zeros({2})},
                                       {"running_mean", torch::zeros({2})}, {"running_var", var},
                                       {"num_batches_tracked", count}});
    return dir.file(name);
  };
  load_weights(bn_file("torchvision.safetensors", torch::tensor({0.5f, 2.0f}), torch::tensor(7, torch::kInt64)), *bn);
  EXPECT_EQ(bn->num_batches_tracked.item<float>(), 7.0f);
  EXPECT_TRUE(torch::equal(bn->running_var, torch::tensor({0.5f, 2.0f})));
  auto negative = bn_file("negative.safetensors", torch::tensor({0.5f, -2.0f}), torch::tensor(7.0f));
  EXPECT_EQ(testing::error_of([&] { load_weights(negative, *bn); }),
            negative + ": tensor 'running_var' holds negative values; a running variance is >= 0");
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

// Note [temporaries on signals]: a process ended by SIGTERM while it writes
// (the launcher stopping a rank whose peer failed) leaves neither the
// temporary nor a changed file; it used to leave "<path>.tmp-<pid>".
TEST(AtomicFileTest, ASignalMidWriteLeavesNoTemporary) {
  TempDir dir;
  const std::string path = dir.file("w.safetensors");
  std::ofstream(path) << "before";
  const pid_t pid = ::fork();
  if (pid == 0) {
    write_atomically(path, [](const std::string& tmp) {
      std::ofstream(tmp) << "half of it";
      ::raise(SIGTERM);
    });
    std::_Exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_EQ(testing::read_text(path), "before");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp-" + std::to_string(pid)));
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) files += entry.exists();
  EXPECT_EQ(files, 1u);
}

}  // namespace
}  // namespace tandem::checkpoint
