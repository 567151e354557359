// --model hf:DIR through the CLI (checkpoint/hf_model.h): what a hostile
// sweep of it found, kept so the next such defect is found here. A
// config.json tandem would build another model from than transformers
// does, or cannot build at all, is refused naming the file and key, exit
// 2, nothing written; weights record the config they were trained with,
// so a config.json changed since is named rather than evaluated.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "testing.h"

namespace tandem {
namespace hf_model_cli {

using testing::run_tandem;
using testing::TempDir;

// A tiny Qwen3's config.json, with `extra` ("key": value, ...) added.
void write_config(const std::string& dir, const std::string& extra) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "qwen3", "vocab_size": 300, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 24, "max_position_embeddings": 64, "tie_word_embeddings": true)" << (extra.empty() ? "" : ", ")
                                      << extra << "}";
}

TEST(HfModelCliTest, ConfigsTandemWouldBuildOtherwiseAreRefusedNamingTheKey) {
  TempDir dir;
  const std::string run = "train --data text:" + testing::write_text(dir) + " --seq-len 16 --max-steps 1 "
                          "--progress off --export-hf " + dir.file("out") + " --model hf:";
  const std::vector<std::pair<std::string, std::string>> cases = {
      // rope_scaling over rope_parameters, as transformers reads both
      {R"("rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
          "rope_scaling": {"rope_type": "linear", "factor": 2.0})", "rope_scaling's rope_type is \"linear\""},
      {R"("rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0})",
       "rope_parameters has no low_freq_factor, which rope_type \"llama3\" needs"},
      {R"("attention_dropout": 0.5)", "attention_dropout is 0.5, expected 0"},
      {R"("num_hidden_layers": 1000000000)", "num_hidden_layers is 1000000000, expected at most 10000"},
      {R"("hidden_act": "gelu")", "hidden_act is \"gelu\", the model's \"silu\""},
      {R"("use_sliding_window": true)", "use_sliding_window is true"},
  };
  int i = 0;
  for (const auto& [extra, message] : cases) {
    const std::string folder = dir.file("c" + std::to_string(i++));
    write_config(folder, extra);
    EXPECT_TRUE(testing::tandem_fails(run + folder, 2, folder + "/config.json: " + message)) << extra;
  }
  std::filesystem::create_directories(dir.file("d/config.json"));
  EXPECT_TRUE(testing::tandem_fails(run + dir.file("d"), 2, "config.json: not a file"));
  std::ofstream(dir.file("c0/config.json")) << R"({"model_type": "qwen3", "vocab_size": 1e400})";
  EXPECT_TRUE(testing::tandem_fails(run + dir.file("c0"), 2, "config.json: not valid JSON"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("out")));
  // Control: the config itself builds and trains.
  write_config(dir.file("good"), "");
  auto r = run_tandem(run + dir.file("good"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Weights of a model built from a config.json record that config: its
// folder's config.json edited since is named (the rotary base changed:
// another model under the same name), and an --export-hf folder evaluates
// from its own config.json once the first folder is gone.
TEST(HfModelCliTest, WeightsKnowTheConfigTheyWereTrainedWith) {
  TempDir dir;
  const std::string data = " --data text:" + testing::write_text(dir) + " --seq-len 16";
  write_config(dir.file("m"), "");
  auto r = run_tandem("train --model hf:" + dir.file("m") + data + " --max-steps 2 --progress off --export-weights " +
                      dir.file("w.safetensors") + " --export-hf " + dir.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_tandem("eval --weights " + dir.file("w.safetensors") + data);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  write_config(dir.file("m"), R"("rope_theta": 10.0)");
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("w.safetensors") + data, 1,
                                    "(a config.json changed since, or weights of another model)"));
  std::filesystem::remove_all(dir.file("m"));
  r = run_tandem("eval --weights " + dir.file("hf") + data);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("hf:" + dir.file("hf") + " from"), std::string::npos) << r.output;
}

}  // namespace hf_model_cli
}  // namespace tandem
