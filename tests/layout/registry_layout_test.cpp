// Every model of the registry under every strategy (ResNet-34 in one process
// only: below), with the defaults of
// every flag but the few that keep a test short (a small data set, batch
// and step count): a default that breaks one model (the measured pipeline
// balance broke every ResNet) fails here, whichever model is added next.
// The ranks are threads (train_threads.h); models with dropout draw their
// masks in the threads' order, which only the losses' being finite, not
// their values, is checked against.
#include <cmath>
#include <fstream>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tandem/models/registry.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace registry_layout {  // the file's own names (a layer's tests compile as one unit)

struct Strategy {
  const char* name;   // what it is
  const char* flags;  // what asks for it
};

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
// (the tiny presets; the larger ones are counted in tests/models).
std::vector<std::string> trained_models() {
  std::vector<std::string> names;
  for (const auto& name : models::model_names()) {
    if (!models::is_language_model(name) || name.find("tiny") != std::string::npos) names.push_back(name);
  }
  return names;
}

class RegistryLayoutTest : public ::testing::TestWithParam<std::string> {};

// ResNet-34 is ResNet-18's blocks, more of them, through the same code
// (models/resnet.cpp): under the strategies it only repeated ResNet-18's
// run at four times the cost (70 s of the suite's slots), so it trains in
// one process only. ResNet-50's blocks are its own (bottlenecks): it
// trains under the strategies that cut or wrap a model by its structure
// (the pipelines' stages, FSDP's units), not under those that copy it
// whole, which repeated ResNet-18's runs at three times the cost.
bool one_process_only(const std::string& model) { return model == "resnet34"; }
bool copies_the_model_whole(const Strategy& s) {
  const std::string name = s.name;
  return name == "DataParallel" || name == "Ddp" || name == "AllReduce";
}

TEST_P(RegistryLayoutTest, TrainsWithDefaultFlagsUnderEveryStrategy) {
  const std::string& model = GetParam();
  for (const auto& strategy : kStrategies) {
    if (one_process_only(model) && *strategy.flags) continue;
    if (model == "resnet50" && copies_the_model_whole(strategy)) continue;
    SCOPED_TRACE(*strategy.flags ? strategy.flags : "(one process)");
    testing::TempDir out;
    const std::string metrics = out.file("m.jsonl");
    const std::string data = models::is_language_model(model) ? " --data text:" + text_file() + " --seq-len 16"
                                                              : " --data idx:" + data_dir();
    const auto job = testing::train_in_threads("--model " + model + " " + strategy.flags + data +
                                               " --batch-size 8 --max-steps 2 --epochs 1 --progress off "
                                               "--metrics-out " + metrics);
    EXPECT_TRUE(job.ok()) << job.report();
    if (!job.ok()) continue;
    auto m = testing::last_metrics(metrics);
    ASSERT_FALSE(m.is_null()) << job.report();
    EXPECT_EQ(m["step"].get<int64_t>(), 2) << job.report();
    EXPECT_TRUE(std::isfinite(m["train_loss"].get<double>())) << job.report();
    EXPECT_TRUE(m["test_loss"].is_number() && std::isfinite(m["test_loss"].get<double>())) << job.report();
  }
}

std::string test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (auto& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryModel, RegistryLayoutTest, ::testing::ValuesIn(trained_models()), test_name);

}  // namespace registry_layout
}  // namespace tandem
