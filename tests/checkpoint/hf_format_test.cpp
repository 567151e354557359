// The language models' weights in transformers' form, both ways: tandem's
// write_hf_folder loads with AutoModelForCausalLM.from_pretrained as it is
// (nothing downloaded: HF_HUB_OFFLINE), and a folder transformers'
// save_pretrained wrote loads into tandem; either way the logits of the
// two implementations agree (float64: 1e-10; transformers' LlamaRMSNorm
// kept in float64: tests/testing/transformers_peer.py).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/hf_model.h"
#include "tandem/models/registry.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::checkpoint {
namespace {

using testing::TempDir;

const char* kScript = R"(
import sys, torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
sys.path.insert(0, sys.argv.pop(1))  # tests/testing
import transformers_peer
transformers_peer.keep_float64_rms_norm()
mode, folder, io = sys.argv[1], sys.argv[2], sys.argv[3]
tokens = load_file(io)["tokens"]
if mode == "load":
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.dtype == torch.float64, model.dtype
else:
    torch.manual_seed(2)
    if mode == "save-gpt2":
        config = GPT2Config(vocab_size=61, n_positions=16, n_embd=12, n_layer=2, n_head=3)
        model = GPT2LMHeadModel(config)
    else:
        config = LlamaConfig(vocab_size=61, hidden_size=16, intermediate_size=24, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                             rms_norm_eps=1e-5, tie_word_embeddings=False)
        model = LlamaForCausalLM(config)
    model = model.to(torch.float64)
    model.save_pretrained(folder, max_shard_size="4KB" if mode == "save-gpt2" else "5GB")
model.eval()
with torch.no_grad():
    save_file({"logits": model(input_ids=tokens).logits.contiguous()}, io + ".out")
print(type(model).__name__)
)";

torch::Tensor their_logits(const std::string& mode, const std::string& folder, const torch::Tensor& tokens,
                           const TempDir& dir) {
  std::ofstream(dir.file("script.py")) << kScript;
  write_safetensors(dir.file("io.safetensors"), {{"tokens", tokens}});
  auto r = testing::run("HF_HUB_OFFLINE=1 " + std::string(TANDEM_PYTHON) + " " + dir.file("script.py") +
                        " " TANDEM_SOURCE_DIR "/tests/testing " + mode +
                        " " + folder + " " + dir.file("io.safetensors") + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return {};
  return read_safetensors(dir.file("io.safetensors.out")).tensors.at(0).second;
}

models::Gpt2Config gpt2_config() {
  models::Gpt2Config c;
  c.vocab_size = 61;
  c.n_positions = 16;
  c.n_embd = 12;
  c.n_layer = 2;
  c.n_head = 3;
  return c;
}

models::LlamaConfig llama_config(bool tied_and_scaled) {
  models::LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_positions = 16;
  c.rms_norm_eps = 1e-5;
  c.tie_embeddings = tied_and_scaled;
  if (tied_and_scaled) {
    c.rope_theta = 500000;
    c.rope_factor = 8;
    c.rope_original_max_positions = 8;
  }
  return c;
}

double largest_difference(const torch::Tensor& a, const torch::Tensor& b) {
  if (!a.defined() || !b.defined() || a.sizes() != b.sizes()) return 1e9;
  return (a - b).abs().max().item<double>();
}

TEST(HfFormatTest, AnExportedGpt2LoadsInTransformersAsItIs) {
  TempDir dir;
  torch::manual_seed(4);
  auto model = models::gpt2(gpt2_config());
  model->to(torch::kFloat64);
  model->eval();
  write_hf_folder(dir.file("export"), model, gpt2_config());
  auto tokens = torch::randint(0, 61, {2, 9}, torch::kInt64);
  auto theirs = their_logits("load", dir.file("export"), tokens, dir);
  EXPECT_LE(largest_difference(model->forward(tokens), theirs), 1e-10);
}

TEST(HfFormatTest, AnExportedLlamaLoadsInTransformersAsItIs) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied, Llama 3 rotary scaling" : "untied");
    TempDir dir;
    torch::manual_seed(4);
    auto model = models::llama(llama_config(tied));
    model->to(torch::kFloat64);
    write_hf_folder(dir.file("export"), model, llama_config(tied));
    auto tokens = torch::randint(0, 61, {2, 9}, torch::kInt64);
    auto theirs = their_logits("load", dir.file("export"), tokens, dir);
    EXPECT_LE(largest_difference(model->forward(tokens), theirs), 1e-10);
  }
}

TEST(HfFormatTest, WhatTransformersSavedLoadsIntoTandem) {
  TempDir dir;
  auto tokens = torch::randint(0, 61, {2, 9}, torch::kInt64);
  auto gpt2 = models::gpt2(gpt2_config());
  gpt2->to(torch::kFloat64);
  auto theirs = their_logits("save-gpt2", dir.file("gpt2"), tokens, dir);
  // GPT-2 saved in shards of at most 4 KB, with transformers' index.
  ASSERT_TRUE(std::filesystem::exists(dir.file("gpt2") + "/model.safetensors.index.json"));
  load_hf_weights(dir.file("gpt2"), gpt2, gpt2_config());
  EXPECT_LE(largest_difference(gpt2->forward(tokens), theirs), 1e-10);
  {  // an index that does not say where each tensor is, or names a shard that is gone
    const std::string index = dir.file("gpt2") + "/model.safetensors.index.json";
    const std::string text = testing::read_text(index);
    std::ofstream(index) << "{\"metadata\": {}}";
    EXPECT_NE(testing::error_of([&] { load_hf_weights(dir.file("gpt2"), gpt2, gpt2_config()); })
                  .find("model.safetensors.index.json: not transformers' index of shards"),
              std::string::npos);
    std::ofstream(index) << text;
    const auto shard = dir.file("gpt2") + "/model-00001-of-" + text.substr(text.find("-of-") + 4, 5) + ".safetensors";
    ASSERT_TRUE(std::filesystem::remove(shard)) << shard;
    EXPECT_NE(testing::error_of([&] { load_hf_weights(dir.file("gpt2"), gpt2, gpt2_config()); }).find(shard),
              std::string::npos);
  }
  auto llama = models::llama(llama_config(false));
  llama->to(torch::kFloat64);
  theirs = their_logits("save-llama", dir.file("llama"), tokens, dir);
  load_hf_weights(dir.file("llama") + "/model.safetensors", llama, llama_config(false));
  EXPECT_LE(largest_difference(llama->forward(tokens), theirs), 1e-10);
  // The control: the model as it was before the load gives other logits.
  auto fresh = models::llama(llama_config(false));
  fresh->to(torch::kFloat64);
  EXPECT_GT(largest_difference(fresh->forward(tokens), theirs), 1e-3);
}

// --export-hf of a run with --dropout writes it as GPT-2's three pdrops,
// as transformers would train the folder on.
TEST(HfFormatTest, TheRunsDropoutIsTheConfigsPdrops) {
  TempDir dir;
  auto config = models::Gpt2Config::preset("gpt2-tiny");
  config.vocab_size = 61;
  auto model = models::gpt2(config);
  write_hf_folder(dir.file("hf"), model, "gpt2-tiny", config.vocab_size, {}, 0.25);
  const auto written = nlohmann::json::parse(testing::read_text(dir.file("hf/config.json")));
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) EXPECT_EQ(written.at(key), 0.25) << key;
}

TEST(HfFormatTest, AFileOfAnotherModelIsRefusedNamingTheTensor) {
  TempDir dir;
  auto small = models::gpt2(gpt2_config());
  write_hf_folder(dir.file("small"), small, gpt2_config());
  auto wider = gpt2_config();
  wider.n_embd = 24;
  auto other = models::gpt2(wider);
  auto before = other->named_parameters()["embed.wte.weight"].clone();
  // Its config.json says so first (Note [a folder's config.json]) ...
  try {
    load_hf_weights(dir.file("small"), other, wider);
    FAIL() << "a model of another width loaded";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("config.json: n_embd is 12, the model's 24"), std::string::npos) << e.what();
  }
  // ... and without one, the tensors do.
  std::filesystem::remove(dir.file("small") + "/config.json");
  try {
    load_hf_weights(dir.file("small"), other, wider);
    FAIL() << "a model of another width loaded";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors: transformer.wte.weight is [61, 12], the model's "
                                         "embed.wte.weight is [61, 24]"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(torch::equal(before, other->named_parameters()["embed.wte.weight"]));  // nothing copied
  auto llama = models::llama(llama_config(false));
  try {
    load_hf_weights(dir.file("small"), llama, llama_config(false));
    FAIL() << "GPT-2 weights loaded into LLaMA";
  } catch (const tandem::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor model.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

// The tensor of `name` in a safetensors file.
torch::Tensor tensor_of(const std::string& file, const std::string& name) {
  for (auto& [n, t] : read_safetensors(file).tensors) {
    if (n == name) return t;
  }
  ADD_FAILURE() << file << ": no tensor " << name;
  return {};
}

// Note [a folder's config.json]: every key that GPT2Config, LlamaConfig,
// MistralConfig, Qwen2Config and Qwen3Config document (and the older
// spellings transformers still reads), set to a value other than its
// default in a folder save_pretrained wrote (tests/checkpoint/
// hf_config_variants.py; each family's base model in several shards),
// is tried two ways. Built from the folder's config.json (--model hf:DIR),
// it gives the logits of the model transformers built from it (float64,
// 1e-10) and its loss (1e-6: transformers' is float32), or is refused
// naming the key; the shapes and settings
// tandem computes (head_dim, key/value heads, biases, epsilon, the rotary
// base, tying, a window past the positions) must build. Loaded into the
// registry's shape (GPT-2 and LLaMA), it gives those logits or is refused
// naming the key; only settings that change nothing tandem computes
// (dropout, token ids, provenance) and equivalent spellings must load.
// Before this test a folder with activation_function "relu" or
// rope_scaling "linear" loaded, and trained tandem's own architecture.
TEST(HfConfigTest, EveryDocumentedKeyIsComputedOrRefused) {
  TempDir dir;
  auto r = testing::run("HF_HUB_OFFLINE=1 " + std::string(TANDEM_PYTHON) + " " TANDEM_SOURCE_DIR
                        "/tests/checkpoint/hf_config_variants.py " TANDEM_SOURCE_DIR "/tests/testing " + dir.path() +
                        " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto tokens = read_safetensors(dir.file("tokens.safetensors")).tensors.at(0).second;
  const auto variants = nlohmann::json::parse(testing::read_text(dir.file("variants.json")));
  const std::set<std::string> must_load = {"", "attn_pdrop", "embd_pdrop", "resid_pdrop", "attention_dropout",
                                           "bos_token_id", "eos_token_id", "use_cache", "dtype", "initializer_range",
                                           "transformers_version", "architectures", "output_hidden_states",
                                           "return_dict", "n_ctx", "pretraining_tp", "max_window_layers"};
  const std::set<std::string> must_build = {"head_dim", "num_key_value_heads", "attention_bias", "mlp_bias",
                                            "rms_norm_eps", "layer_norm_epsilon", "rope_theta", "tie_word_embeddings",
                                            "sliding_window", "vocab_size", "hidden_size", "num_hidden_layers",
                                            "n_embd", "n_layer", "intermediate_size", "max_position_embeddings"};
  enable_hf_models();
  int loaded = 0, refused = 0, built = 0, built_refused = 0;
  // One way: the model, then the folder's weights; the logits and loss checked against transformers'.
  auto check = [&](const nlohmann::json& v, const std::string& key, const std::function<models::Sequence()>& make,
                   bool must, int& ok, int& no) {
    const std::string folder = v["folder"];
    models::Sequence model;
    try {
      model = make();
    } catch (const tandem::Error& e) {
      ++no;
      EXPECT_NE(std::string(e.what()).find(key.empty() ? std::string("\n") : key), std::string::npos) << e.what();
      EXPECT_FALSE(must) << "refused: " << e.what();
      return;
    }
    ++ok;
    if (!v["logits"].get<bool>()) {
      ADD_FAILURE() << "loaded a config transformers cannot build a model from";
      return;
    }
    model->eval();
    torch::NoGradGuard no_grad;
    const auto logits = model->forward(tokens);
    EXPECT_LE(largest_difference(logits, tensor_of(folder + "/logits.safetensors", "logits")), 1e-10)
        << "loaded, but computes another model";
    const int64_t vocab = logits.size(-1);
    const auto loss = torch::nn::functional::cross_entropy(
        logits.slice(1, 0, -1).reshape({-1, vocab}), tokens.slice(1, 1).reshape({-1}));
    // transformers' loss casts the logits to float32 first (ForCausalLMLoss).
    EXPECT_LE(largest_difference(loss.reshape({1}), tensor_of(folder + "/logits.safetensors", "loss")), 1e-6);
  };
  for (const auto& v : variants) {
    const std::string key = v["key"].is_null() ? "" : v["key"].get<std::string>();
    const std::string family = v["family"];
    const std::string folder = v["folder"];
    SCOPED_TRACE(family + " " + (key.empty() ? "(as saved)" : key + " = " + v["value"].dump()));
    const bool has_logits = v["logits"].get<bool>();
    if (key.empty()) {  // the base model: several shards under an index
      EXPECT_TRUE(std::filesystem::exists(folder + "/model.safetensors.index.json"));
      EXPECT_FALSE(std::filesystem::exists(folder + "/model.safetensors"));
    }
    check(v, key, [&] {
      models::ModelOptions options;
      options.vocab_size = 1;  // the data's: the model's own is the config's
      auto model = models::make_model("hf:" + folder, options);
      model->to(torch::kFloat64);
      load_hf_weights(folder, model, "hf:" + folder, 0);
      return model;
    }, has_logits && ((must_load.count(key) > 0 && key != "attention_dropout") ||
                      (must_build.count(key) > 0 && !(family == "gpt2" && key == "tie_word_embeddings"))),
          built, built_refused);
    if (family != "gpt2" && family != "llama") continue;
    const bool gpt2 = family == "gpt2";
    check(v, key, [&] {
      auto model = gpt2 ? models::gpt2(gpt2_config()) : models::llama(llama_config(false));
      model->to(torch::kFloat64);
      gpt2 ? load_hf_weights(folder, model, gpt2_config()) : load_hf_weights(folder, model, llama_config(false));
      return model;
    }, must_load.count(key) > 0, loaded, refused);
  }
  std::printf("built from config.json: %d variants with transformers' logits, %d refused naming the key; into the "
              "registry's shape: %d loaded, %d refused\n", built, built_refused, loaded, refused);
  EXPECT_GE(loaded, static_cast<int>(must_load.size()) - 1);
  EXPECT_GE(refused, 20);
  EXPECT_GE(built, 5 * 20);
  EXPECT_GE(built_refused, 5 * 4);
}

}  // namespace
}  // namespace tandem::checkpoint
