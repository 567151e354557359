// Sharded transformers folders both ways (Note [weight shards] in
// src/checkpoint/hf_shards.h): a GPT-2 and a LLaMA that transformers made
// and saved in float64 as several shards under an index start a run with
// --init-weights, and --export-hf with a small --export-hf-shard-gb writes
// them back as shards that transformers loads equal to what went in (one
// step at lr 1e-12; control: a run from a random start); tandem sample
// reads the sharded folder's metadata.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace hf_shards_cli {

using testing::run_tandem;
using testing::TempDir;

const char* kScript = R"(
import sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.utils import logging
logging.disable_progress_bar()
if sys.argv[1] == "save":  # save TEMPLATE OUT: a random float64 model of TEMPLATE's config, in shards
    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(sys.argv[2])
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64)
    model.save_pretrained(sys.argv[3], max_shard_size="300KB")
    sys.exit(0)
# check IN OUT CONTROL
load = lambda folder: AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64).state_dict()
a = load(sys.argv[2])
for name, folder in (("out", sys.argv[3]), ("control", sys.argv[4])):
    b = load(folder)
    assert sorted(a) == sorted(b), (name, sorted(set(a) ^ set(b)))
    print(name, "largest difference", max((a[k] - b[k]).abs().max().item() for k in a))
)";

double difference(const std::string& output, const std::string& name) {
  const auto at = output.find(name + " largest difference ");
  return at == std::string::npos ? 1e300 : std::stod(output.substr(at + name.size() + 20));
}

int shard_files(const std::string& dir) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    n += e.path().filename().string().rfind("model-", 0) == 0;
  }
  return n;
}

class HfShardsCliTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfShardsCliTest, ShardedFoldersGoInAndComeOut) {
  const std::string model = GetParam();
  TempDir dir;
  std::ofstream(dir.file("hf.py")) << kScript;
  auto python = [&](const std::string& args) {
    return testing::run("HF_HUB_OFFLINE=1 " + std::string(TANDEM_PYTHON) + " " + dir.file("hf.py") + " " + args);
  };
  const std::string data = " --model " + model + " --data text:" + testing::write_text(dir) + " --progress off ";
  auto r = run_tandem("train" + data + "--seq-len 16 --batch-size 8 --max-steps 1 --export-hf " + dir.file("template"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto saved = python("save " + dir.file("template") + " " + dir.file("in"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  ASSERT_TRUE(std::filesystem::exists(dir.file("in/model.safetensors.index.json")));
  ASSERT_GE(shard_files(dir.file("in")), 2);
  const std::string step = "train" + data + "--seq-len 16 --batch-size 8 --max-steps 1 --lr 1e-12 --dtype float64 "
                           "--export-hf-shard-gb 0.0003 ";
  r = run_tandem(step + "--init-weights " + dir.file("in") + " --export-hf " + dir.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_tandem(step + "--export-hf " + dir.file("control"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_GE(shard_files(dir.file("out")), 2);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/model.safetensors")));
  auto checked = python("check " + dir.file("in") + " " + dir.file("out") + " " + dir.file("control"));
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_LE(difference(checked.output, "out"), 1e-10) << checked.output;  // float64, one step at lr 1e-12
  EXPECT_GT(difference(checked.output, "control"), 1e-3) << checked.output;
  // --init-weights DIR alone builds the model DIR/config.json describes.
  r = run_tandem("train --data text:" + testing::write_text(dir) + " --progress off --seq-len 16 --batch-size 8 "
                 "--max-steps 1 --dtype float64 --init-weights " + dir.file("in"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hf:" + dir.file("in") + " on text:"), std::string::npos) << r.output;
  // ... and eval --weights DIR evaluates it, as transformers saved it.
  r = run_tandem("eval --weights " + dir.file("in") + " --data text:" + testing::write_text(dir) + " --seq-len 16");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hf:" + dir.file("in") + " from"), std::string::npos) << r.output;
  // tandem's metadata travels in the shards: sample reads the folder.
  auto sampled = run_tandem("sample --weights " + dir.file("out") + " --prompt 'The ' --max-tokens 4 --temperature 0");
  EXPECT_EQ(sampled.exit_code, 0) << sampled.output;
  // Written again whole (the default 5 GB), the shards go.
  r = run_tandem("train" + data + "--seq-len 16 --batch-size 8 --max-steps 1 --export-hf " + dir.file("out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(shard_files(dir.file("out")), 0);
  EXPECT_FALSE(std::filesystem::exists(dir.file("out/model.safetensors.index.json")));
}

INSTANTIATE_TEST_SUITE_P(Families, HfShardsCliTest, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) { return info.param == "gpt2-tiny" ? "Gpt2" : "Llama"; });

}  // namespace hf_shards_cli
}  // namespace tandem
