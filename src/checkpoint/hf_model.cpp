// Models from a transformers config.json (checkpoint/hf_model.h).
#include "tandem/checkpoint/hf_model.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "hf_config.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::checkpoint {

namespace {

using json = nlohmann::json;
using models::LlamaFamily;

// Typed reads of config.json's keys, each naming the file and the key; a
// key left out (or null) reads as transformers' default.
struct Keys {
  const std::string& file;
  const json& config;

  bool has(const char* key) const { return config.contains(key) && !config.at(key).is_null(); }
  int64_t count(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    const json& v = config.at(key);
    TANDEM_CHECK(v.is_number_integer() && v.get<int64_t>() > 0, file, ": ", key, " is ", v.dump(),
                 ", expected a positive integer");
    return v.get<int64_t>();
  }
  double positive(const json& v, const std::string& key) const {
    TANDEM_CHECK(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0, file, ": ", key, " is ",
                 v.dump(), ", expected a positive number");
    return v.get<double>();
  }
  double number(const char* key, double fallback) const { return has(key) ? positive(config.at(key), key) : fallback; }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    TANDEM_CHECK(config.at(key).is_boolean(), file, ": ", key, " is ", config.at(key).dump(), ", expected true or false");
    return config.at(key).get<bool>();
  }
};

// Past any model built (Llama 3.1 405B: 126 layers); a typo's billion
// layers would only exhaust memory naming each one.
constexpr int64_t kMostLayers = 10000;

// transformers 5.24's defaults of each family's config class, for keys a
// file leaves out.
struct Defaults {
  LlamaFamily family;
  int64_t vocab, hidden, intermediate, layers, heads, kv_heads;  // kv_heads 0: the heads
  int64_t head_dim;                                             // 0: width / heads
  int64_t positions;
  double eps, theta;
};

const std::map<std::string, Defaults>& families() {
  static const std::map<std::string, Defaults> all = {
      {"llama", {LlamaFamily::kLlama, 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, 10000}},
      {"mistral", {LlamaFamily::kMistral, 32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-6, 10000}},
      {"qwen2", {LlamaFamily::kQwen2, 151936, 4096, 22016, 32, 32, 32, 0, 32768, 1e-6, 10000}},
      {"qwen3", {LlamaFamily::kQwen3, 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, 10000}},
      {"mixtral", {LlamaFamily::kMixtral, 32000, 4096, 14336, 32, 32, 8, 0, 131072, 1e-5, 1e6}},
      {"qwen3_moe", {LlamaFamily::kQwen3Moe, 151936, 2048, 6144, 24, 32, 4, 0, 32768, 1e-6, 10000}},
  };
  return all;
}

// The rotary settings: rope_parameters, or the older rope_scaling beside
// rope_theta. Their every key is checked again by check_hf_config.
void read_rope(const Keys& k, models::LlamaConfig& c) {
  std::string where;
  const json rope = internal::rope_settings(k.file, k.config, &where);
  auto read = [&](const char* name, double& out) {
    if (rope.contains(name)) out = k.positive(rope.at(name), where + "." + name);
  };
  read("rope_theta", c.rope_theta);
  const json type = rope.contains("rope_type") ? rope.at("rope_type") : rope.contains("type") ? rope.at("type") : json();
  if (type != "llama3") return;  // "default", or one check_hf_config refuses by name
  for (const char* needed : {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    TANDEM_CHECK(rope.contains(needed), k.file, ": ", where, " has no ", needed, ", which rope_type \"llama3\" needs");
  }
  read("factor", c.rope_factor);
  read("low_freq_factor", c.rope_low_freq_factor);
  read("high_freq_factor", c.rope_high_freq_factor);
  double original = 0;
  read("original_max_position_embeddings", original);
  c.rope_original_max_positions = static_cast<int64_t>(original);
}

models::LlamaConfig llama_family_config(const Keys& k, const Defaults& d) {
  models::LlamaConfig c;
  c.family = d.family;
  c.fixed_vocabulary = true;
  c.vocab_size = k.count("vocab_size", d.vocab);
  c.hidden_size = k.count("hidden_size", d.hidden);
  c.intermediate_size = k.count("intermediate_size", d.intermediate);
  c.num_layers = k.count("num_hidden_layers", d.layers);
  TANDEM_CHECK(c.num_layers <= kMostLayers, k.file, ": num_hidden_layers is ", c.num_layers, ", expected at most ",
               kMostLayers);
  c.num_heads = k.count("num_attention_heads", d.heads);
  // Left out: the class's default; null: as many as the heads.
  const bool kv_null = k.config.contains("num_key_value_heads") && k.config.at("num_key_value_heads").is_null();
  c.num_kv_heads = k.count("num_key_value_heads", d.kv_heads > 0 && !kv_null ? d.kv_heads : c.num_heads);
  // Left out: the width over the heads, rounded down, as transformers' attention takes it.
  c.head_size = k.count("head_dim", d.head_dim > 0 ? d.head_dim : c.hidden_size / c.num_heads);
  if (c.head_size * c.num_heads == c.hidden_size) c.head_size = 0;  // width / heads
  c.max_positions = k.count("max_position_embeddings", d.positions);
  c.rms_norm_eps = k.number("rms_norm_eps", d.eps);
  c.rope_theta = d.theta;
  read_rope(k, c);
  c.tie_embeddings = k.flag("tie_word_embeddings", false);
  const bool qwen3 = d.family == LlamaFamily::kQwen3 || d.family == LlamaFamily::kQwen3Moe;
  if (d.family == LlamaFamily::kLlama || qwen3) c.qkv_bias = c.o_bias = k.flag("attention_bias", false);
  if (d.family == LlamaFamily::kLlama) c.mlp_bias = k.flag("mlp_bias", false);
  if (d.family == LlamaFamily::kQwen2) c.qkv_bias = true;  // Qwen2's projections always have them
  c.qk_norm = qwen3;
  TANDEM_CHECK(!k.has("attention_dropout") || (k.config.at("attention_dropout").is_number() &&
                                               k.config.at("attention_dropout").get<double>() == 0),
               k.file, ": attention_dropout is ", k.has("attention_dropout") ? k.config.at("attention_dropout").dump()
                                                                            : "", ", expected 0: tandem's ",
               "LLaMA-family models train without dropout");
  if (d.family == LlamaFamily::kMistral) {  // 4096 when left out, none when null
    c.sliding_window = k.config.contains("sliding_window") ? k.count("sliding_window", 0) : 4096;
  }
  if (d.family == LlamaFamily::kMixtral) {
    c.num_experts = k.count("num_local_experts", 8);
    c.experts_per_token = k.count("num_experts_per_tok", 2);
    c.expert_intermediate_size = c.intermediate_size;
    c.normalize_top_k = true;
  } else if (d.family == LlamaFamily::kQwen3Moe) {
    c.num_experts = k.count(k.has("num_experts") ? "num_experts" : "num_local_experts", 128);
    c.experts_per_token = k.count("num_experts_per_tok", 8);
    c.expert_intermediate_size = k.count("moe_intermediate_size", 768);
    c.normalize_top_k = k.flag("norm_topk_prob", false);
  }
  return c;
}

models::Gpt2Config gpt2_config(const Keys& k) {
  models::Gpt2Config c;
  c.fixed_vocabulary = true;
  c.vocab_size = k.count("vocab_size", 50257);
  c.n_positions = k.count("n_positions", 1024);
  c.n_embd = k.count("n_embd", 768);
  c.n_layer = k.count("n_layer", 12);
  TANDEM_CHECK(c.n_layer <= kMostLayers, k.file, ": n_layer is ", c.n_layer, ", expected at most ", kMostLayers);
  c.n_head = k.count("n_head", 12);
  c.layer_norm_eps = k.number("layer_norm_epsilon", 1e-5);
  return c;
}

}  // namespace

HfModelConfig read_hf_model_config(const std::string& dir) {
  const std::string file = dir + "/config.json";
  std::error_code ec;
  TANDEM_CHECK(!std::filesystem::exists(file, ec) || std::filesystem::is_regular_file(file, ec), file,
               ": not a file (transformers' config.json)");
  std::ifstream in(file);
  TANDEM_CHECK(in.good(), file, ": cannot read it (a folder transformers' save_pretrained wrote holds a config.json)");
  const json config = json::parse(in, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(!config.is_discarded(), file, ": not valid JSON (transformers' config.json)");
  TANDEM_CHECK(config.is_object(), file, ": not a JSON object (transformers' config.json)");
  TANDEM_CHECK(config.contains("model_type") && config.at("model_type").is_string(), file,
               ": no model_type (gpt2, llama, mistral, qwen2, qwen3, mixtral or qwen3_moe)");
  const std::string type = config.at("model_type").get<std::string>();
  const Keys keys{file, config};
  HfModelConfig out;
  if (type == "gpt2") {
    out.gpt2 = true;
    out.gpt2_config = gpt2_config(keys);
    out.gpt2_config.check();
    internal::check_hf_config(file, config, internal::gpt2_json(out.gpt2_config), internal::HfFamily::kGpt2);
    return out;
  }
  auto it = families().find(type);
  TANDEM_CHECK(it != families().end(), file, ": model_type is \"", type, "\", a family tandem does not build (it ",
               "builds gpt2, llama, mistral, qwen2, qwen3, mixtral and qwen3_moe)");
  out.llama_config = llama_family_config(keys, it->second);
  out.llama_config.check();
  internal::check_hf_config(file, config, internal::llama_json(out.llama_config),
                            internal::hf_family(out.llama_config));
  return out;
}

void enable_hf_models() {
  models::add_model_resolver("hf:", [](const std::string& name) {
    const std::string dir = name.substr(3);
    TANDEM_CHECK_USAGE(!dir.empty(), "--model hf:DIR: expected a folder after hf: (one transformers' ",
                       "save_pretrained wrote, with its config.json)");
    HfModelConfig c;
    try {
      c = read_hf_model_config(dir);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      TANDEM_CHECK_USAGE(false, "--model ", name, ": ", e.what());
    }
    if (c.gpt2) {
      models::add_gpt2_model(name, c.gpt2_config);
    } else {
      models::add_llama_model(name, c.llama_config);
    }
  });
}

}  // namespace tandem::checkpoint
