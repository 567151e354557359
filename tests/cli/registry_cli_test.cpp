// Every model of the registry under every strategy, with the defaults of
// every flag but the few that keep a test short (a small data set, batch
// and step count): a default that breaks one model (the measured pipeline
// balance broke every ResNet) fails here, whichever model is added next.
#include <cmath>
#include <fstream>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "tandem/models/registry.h"
#include "testing.h"

namespace tandem {
namespace {

struct Strategy {
  const char* name;   // for the test's name
  const char* flags;  // what asks for it
};
void PrintTo(const Strategy& s, std::ostream* os) { *os << (*s.flags ? s.flags : "(one process)"); }

const Strategy kStrategies[] = {
    {"OneProcess", ""},
    {"DataParallel", "--strategy dp --devices cpu,cpu"},
    {"Pipeline", "--strategy pipeline --devices cpu,cpu"},
    {"Ddp", "--nproc-per-node 2"},
    {"AllReduce", "--nproc-per-node 2 --strategy allreduce"},
    {"Fsdp", "--nproc-per-node 2 --strategy fsdp"},
    {"PipelineOverRanks", "--nproc-per-node 2 --strategy pipeline"},
};

// One data set for the whole suite: 64 training and 16 test images.
const std::string& data_dir() {
  static testing::TempDir* dir = [] {
    auto* d = new testing::TempDir();  // left for the process's end: shared by every test
    testing::write_synthetic_idx(d->path(), 64, 16);
    return d;
  }();
  return dir->path();
}

// One text file for the language models: 4,000 bytes of prose.
std::string text_file() {
  static testing::TempDir* dir = [] {
    auto* d = new testing::TempDir();
    std::string text;
    while (text.size() < 4000) text += "The quick brown fox jumps over the lazy dog. Pack my box with jugs. ";
    std::ofstream(d->file("t.txt")) << text;
    return d;
  }();
  return dir->file("t.txt");
}

// The image models, and the language models small enough to train here
// (the larger presets are counted in tests/models).
std::vector<std::string> trained_models() {
  std::vector<std::string> names;
  for (const auto& name : models::model_names()) {
    if (!models::is_language_model(name) || name == "gpt2-tiny" || name == "llama-tiny") names.push_back(name);
  }
  return names;
}

class RegistryCliTest : public ::testing::TestWithParam<std::tuple<std::string, Strategy>> {};

TEST_P(RegistryCliTest, TrainsWithDefaultFlags) {
  const auto& [model, strategy] = GetParam();
  testing::TempDir out;
  const std::string metrics = out.file("m.jsonl");
  const std::string data = models::is_language_model(model) ? " --data text:" + text_file() + " --seq-len 16"
                                                            : " --data idx:" + data_dir();
  auto r = testing::run_tandem("train --model " + model + " " + strategy.flags + data +
                               " --batch-size 8 --max-steps 2 --epochs 1 --progress off --metrics-out " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto m = testing::last_metrics(metrics);
  ASSERT_FALSE(m.is_null()) << r.output;
  EXPECT_EQ(m["step"].get<int64_t>(), 2) << r.output;
  EXPECT_TRUE(std::isfinite(m["train_loss"].get<double>())) << r.output;
  EXPECT_TRUE(m["test_loss"].is_number() && std::isfinite(m["test_loss"].get<double>())) << r.output;
}

std::string test_name(const ::testing::TestParamInfo<RegistryCliTest::ParamType>& info) {
  std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
  for (auto& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryModelEveryStrategy, RegistryCliTest,
                         ::testing::Combine(::testing::ValuesIn(trained_models()),
                                            ::testing::ValuesIn(kStrategies)),
                         test_name);

}  // namespace
}  // namespace tandem
