#include "tandem/checkpoint/hf_format.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include <torch/torch.h>

#include "hf_config.h"
#include "hf_shards.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/registry.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"

namespace tandem::checkpoint {

namespace internal {

using json = nlohmann::json;

json gpt2_json(const models::Gpt2Config& c) {
  json config = {{"architectures", {"GPT2LMHeadModel"}},
                 {"model_type", "gpt2"},
                 {"vocab_size", c.vocab_size},
                 {"n_positions", c.n_positions},
                 {"n_embd", c.n_embd},
                 {"n_layer", c.n_layer},
                 {"n_head", c.n_head},
                 {"n_inner", nullptr},
                 {"activation_function", "gelu_new"},
                 {"resid_pdrop", c.dropout},
                 {"embd_pdrop", c.dropout},
                 {"attn_pdrop", c.dropout},
                 {"layer_norm_epsilon", c.layer_norm_eps},
                 {"initializer_range", 0.02},
                 {"scale_attn_weights", true},
                 {"tie_word_embeddings", true}};
  // GPT-2's <|endoftext|> is token 50256; a smaller vocabulary (bytes) has
  // no such token, and transformers' default would point past it.
  const json end = c.vocab_size > 50256 ? json(50256) : json(nullptr);
  config["bos_token_id"] = end;
  config["eos_token_id"] = end;
  return config;
}

json llama_json(const models::LlamaConfig& c) {
  json rope = {{"rope_type", "default"}, {"rope_theta", c.rope_theta}};
  if (c.rope_factor != 0) {
    rope = {{"rope_type", "llama3"},
            {"rope_theta", c.rope_theta},
            {"factor", c.rope_factor},
            {"low_freq_factor", c.rope_low_freq_factor},
            {"high_freq_factor", c.rope_high_freq_factor},
            {"original_max_position_embeddings", c.rope_original_max_positions}};
  }
  using models::LlamaFamily;
  const LlamaFamily f = c.family;
  const bool mixtral = f == LlamaFamily::kMixtral, qwen_moe = f == LlamaFamily::kQwen3Moe;
  static const std::map<LlamaFamily, std::pair<const char*, const char*>> kinds = {
      {LlamaFamily::kLlama, {"LlamaForCausalLM", "llama"}},
      {LlamaFamily::kMistral, {"MistralForCausalLM", "mistral"}},
      {LlamaFamily::kQwen2, {"Qwen2ForCausalLM", "qwen2"}},
      {LlamaFamily::kQwen3, {"Qwen3ForCausalLM", "qwen3"}},
      {LlamaFamily::kMixtral, {"MixtralForCausalLM", "mixtral"}},
      {LlamaFamily::kQwen3Moe, {"Qwen3MoeForCausalLM", "qwen3_moe"}}};
  const auto& [architecture, model_type] = kinds.at(f);
  json config = {{"architectures", {architecture}},
                 {"model_type", model_type},
                 {"vocab_size", c.vocab_size},
                 {"hidden_size", c.hidden_size},
                 {"intermediate_size", c.intermediate_size},
                 {"num_hidden_layers", c.num_layers},
                 {"num_attention_heads", c.num_heads},
                 {"num_key_value_heads", c.num_kv_heads},
                 {"head_dim", c.head_dim()},
                 {"max_position_embeddings", c.max_positions},
                 {"rms_norm_eps", c.rms_norm_eps},
                 {"rope_parameters", rope},
                 {"hidden_act", "silu"},
                 {"attention_bias", c.o_bias},
                 {"mlp_bias", c.mlp_bias},
                 {"initializer_range", 0.02},
                 {"tie_word_embeddings", c.tie_embeddings}};
  // What each family's config has of these: Mistral and Qwen2 no bias
  // keys (Qwen2's q/k/v biases always there), Qwen3 no mlp_bias; the
  // window settings.
  const json window = c.sliding_window > 0 ? json(c.sliding_window) : json(nullptr);
  const json full = json(std::vector<std::string>(static_cast<size_t>(c.num_layers), "full_attention"));
  if (f == LlamaFamily::kMistral) {
    config.erase("attention_bias");
    config.erase("mlp_bias");
    config["sliding_window"] = window;
  } else if (f == LlamaFamily::kQwen2 || f == LlamaFamily::kQwen3) {
    if (f == LlamaFamily::kQwen2) config.erase("attention_bias");
    config.erase("mlp_bias");
    config["use_sliding_window"] = false;
    config["sliding_window"] = nullptr;
    config["layer_types"] = full;
  }
  if (!c.has_experts()) return config;
  // The experts' settings (models/moe.h); the balancing loss's weight is
  // a training setting, written as transformers' default.
  config["output_router_logits"] = false;
  config["router_aux_loss_coef"] = 0.001;
  config["num_experts_per_tok"] = c.experts_per_token;
  config["sliding_window"] = nullptr;
  if (mixtral) {
    config.erase("attention_bias");
    config.erase("mlp_bias");
    config["num_local_experts"] = c.num_experts;
    config["router_jitter_noise"] = 0.0;
  } else {
    config.erase("mlp_bias");
    config["num_experts"] = c.num_experts;
    config["moe_intermediate_size"] = c.expert_intermediate_size;
    config["norm_topk_prob"] = c.normalize_top_k;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = json::array();
    config["use_sliding_window"] = false;
  }
  return config;
}

HfFamily hf_family(const models::LlamaConfig& c) {
  switch (c.family) {
    case models::LlamaFamily::kMistral: return HfFamily::kMistral;
    case models::LlamaFamily::kQwen2: return HfFamily::kQwen2;
    case models::LlamaFamily::kQwen3: return HfFamily::kQwen3;
    case models::LlamaFamily::kMixtral: return HfFamily::kMixtral;
    case models::LlamaFamily::kQwen3Moe: return HfFamily::kQwen3Moe;
    default: return HfFamily::kLlama;
  }
}

}  // namespace internal

using internal::gpt2_json;
using internal::hf_family;
using internal::llama_json;

namespace {

using json = nlohmann::json;
// transformers' names of a tensor of the model: one, or one per slice along
// dim 0 (an experts' 3-D weight, saved one expert per tensor).
using NameMap = std::function<std::vector<std::string>(const std::string&)>;

NameMap one_name(std::string (*name)(const std::string&)) {
  return [name](const std::string& n) { return std::vector<std::string>{name(n)}; };
}

std::string dtype_word(torch::ScalarType t) {
  switch (t) {
    case torch::kFloat64: return "float64";
    case torch::kFloat16: return "float16";
    case torch::kBFloat16: return "bfloat16";
    default: return "float32";
  }
}

void write_folder(const std::string& dir, models::Sequence& model, json config, const NameMap& hf_name,
                  std::map<std::string, std::string> metadata, double max_shard_bytes) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  TANDEM_CHECK(!ec && std::filesystem::is_directory(dir), dir, ": cannot make the folder: ", ec.message());
  NamedTensors tensors;
  for (const auto& p : model->named_parameters()) {
    const auto names = hf_name(p.key());
    if (names.size() == 1) {
      tensors.emplace_back(names.front(), p.value().detach());
      continue;
    }
    TANDEM_CHECK(p.value().size(0) == static_cast<int64_t>(names.size()), p.key(), ": ", p.value().sizes(),
                 " for ", names.size(), " tensors of transformers");
    for (size_t i = 0; i < names.size(); ++i) tensors.emplace_back(names[i], p.value().detach()[i].contiguous());
  }
  config["dtype"] = dtype_word(models::parameter_dtype(*model));
  config["transformers_version"] = "5.24.0";  // the version its form follows
  metadata["format"] = "pt";  // what transformers reads; tandem's keys beside it are ignored there
  internal::write_weight_shards(dir, tensors, metadata, max_shard_bytes);
  const std::string text = config.dump(2) + "\n";
  write_atomically(dir + "/config.json", [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    TANDEM_CHECK(out.good(), tmp, ": cannot write the model's config.json");
  });
}

// The weight_map of dir's model.safetensors.index.json: tensor -> shard,
// each shard a file in dir.
std::map<std::string, std::string> read_index(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::ifstream in(index);
  const auto parsed = json::parse(in, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK(parsed.is_object() && parsed.contains("weight_map") && parsed.at("weight_map").is_object(), index,
               ": not transformers' index of shards (a JSON object with a \"weight_map\" of tensor names to files)");
  std::map<std::string, std::string> where;
  for (const auto& [name, shard] : parsed.at("weight_map").items()) {
    TANDEM_CHECK(shard.is_string() && !shard.get<std::string>().empty() &&
                     shard.get<std::string>().find('/') == std::string::npos,
                 index, ": the weight_map's file for ", name, " is ", shard.dump(), ", expected a file name in ", dir);
    where[name] = shard.get<std::string>();
  }
  return where;
}

// Strict load under transformers' names (the header's rules).
// The tensors of a folder save_pretrained wrote: its model.safetensors, or
// the shards its model.safetensors.index.json names (weights larger than
// max_shard_size, transformers' default 5 GB), each read whole and checked.
NamedTensors read_folder(const std::string& dir, std::map<std::string, std::string>* metadata = nullptr) {
  namespace fs = std::filesystem;
  const std::string index = dir + "/model.safetensors.index.json";
  std::error_code ec;
  if (!fs::exists(index, ec)) return read_safetensors(dir + "/model.safetensors").tensors;
  std::map<std::string, std::string> where = read_index(dir);  // tensor -> shard
  std::set<std::string> shards;
  for (const auto& [name, shard] : where) shards.insert(shard);
  NamedTensors tensors;
  for (const auto& shard : shards) {
    auto file = read_safetensors(dir + "/" + shard);
    // The first shard's metadata: --export-hf writes tandem's in each (Note [weight shards]).
    if (metadata && shard == *shards.begin()) *metadata = file.metadata;
    for (auto& [name, t] : file.tensors) {
      auto it = where.find(name);
      TANDEM_CHECK(it != where.end() && it->second == shard, dir, "/", shard, ": holds ", name, ", which ", index,
                   it == where.end() ? " does not name" : " places in " + it->second);
      where.erase(it);
      tensors.emplace_back(name, t);
    }
  }
  TANDEM_CHECK(where.empty(), index, ": names ", where.begin()->first, " in ", where.begin()->second,
               ", which does not hold it");
  return tensors;
}

void load(const std::string& path, models::Sequence& model, const NameMap& hf_name, const std::string& prefix,
          bool tied) {
  std::string file = path;
  std::error_code ec;
  const bool folder = std::filesystem::is_directory(path, ec);
  if (folder) {  // the errors below name the file, or the index of the shards
    const bool sharded = std::filesystem::exists(path + "/model.safetensors.index.json", ec);
    file = path + (sharded ? "/model.safetensors.index.json" : "/model.safetensors");
  }
  auto read = folder ? read_folder(path) : read_safetensors(file).tensors;
  std::map<std::string, torch::Tensor> by_name;
  for (auto& [name, t] : read) {
    std::string n = name;
    if (n.rfind(prefix, 0) != 0 && n != "lm_head.weight") n = prefix + n;  // the Hub's unprefixed GPT-2
    by_name[n] = t;
  }
  auto ends_with = [](const std::string& n, const std::string& tail) {
    return n.size() >= tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0;
  };
  auto ignorable = [&](const std::string& n) {  // GPT-2's causal-mask buffers, a tied head
    return ends_with(n, ".attn.bias") || ends_with(n, ".attn.masked_bias") || (tied && n == "lm_head.weight");
  };
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  std::set<std::string> used;
  for (const auto& p : model->named_parameters()) {
    const auto names = hf_name(p.key());
    std::vector<torch::Tensor> slices;
    for (const auto& n : names) {
      auto it = by_name.find(n);
      TANDEM_CHECK(it != by_name.end(), file, ": no tensor ", n, " (the model's ", p.key(), ")");
      const auto want = names.size() == 1 ? p.value().sizes() : p.value().sizes().slice(1);
      TANDEM_CHECK(it->second.sizes() == want, file, ": ", n, " is ", it->second.sizes(), ", the model's ",
                   p.key(), names.size() == 1 ? " is " : " has slices of ", want);
      slices.push_back(it->second);
      used.insert(n);
    }
    copies.emplace_back(p.value(), names.size() == 1 ? slices.front() : torch::stack(slices));
  }
  for (const auto& [n, t] : by_name) {
    TANDEM_CHECK(used.count(n) > 0 || ignorable(n), file, ": ", n, " is not a tensor of the model");
  }
  torch::NoGradGuard no_grad;
  for (auto& [to, from] : copies) to.copy_(from);
}

NameMap llama_names(const models::LlamaConfig& c) {
  return [c](const std::string& n) { return models::llama_hf_names(n, c); };
}

// Note [a folder's config.json] (hf_config.cpp): a config.json beside the
// weights is checked whole against the model's; without one, only the
// tensors' names and shapes are.
void check_config(const std::string& path, const json& expected, internal::HfFamily family) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path folder = fs::is_directory(path, ec) ? fs::path(path) : fs::path(path).parent_path();
  const auto file = (folder / "config.json").string();
  if (!fs::exists(file, ec)) return;
  std::ifstream in(file);
  internal::check_hf_config(file, json::parse(in, nullptr, /*allow_exceptions=*/false), expected, family);
}

}  // namespace

void write_hf_folder(const std::string& dir, models::Sequence& model, const models::Gpt2Config& c,
                     const std::map<std::string, std::string>& metadata, double max_shard_bytes) {
  write_folder(dir, model, gpt2_json(c), one_name(models::gpt2_hf_name), metadata, max_shard_bytes);
}

void write_hf_folder(const std::string& dir, models::Sequence& model, const models::LlamaConfig& c,
                     const std::map<std::string, std::string>& metadata, double max_shard_bytes) {
  write_folder(dir, model, llama_json(c), llama_names(c), metadata, max_shard_bytes);
}

void load_hf_weights(const std::string& path, models::Sequence& model, const models::Gpt2Config& config) {
  check_config(path, gpt2_json(config), internal::HfFamily::kGpt2);
  load(path, model, one_name(models::gpt2_hf_name), "transformer.", /*tied=*/true);
}

void load_hf_weights(const std::string& path, models::Sequence& model, const models::LlamaConfig& config) {
  check_config(path, llama_json(config), hf_family(config));
  load(path, model, llama_names(config), "model.", config.tie_embeddings);
}

namespace {

bool among(const std::string& name, const std::vector<std::string>& names) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

bool has_hf_form(const std::string& model_name) {
  models::resolve_model_name(model_name);  // "hf:DIR" (Note [model resolvers])
  return among(model_name, models::Gpt2Config::preset_names()) || among(model_name, models::LlamaConfig::preset_names());
}

std::string model_config_json(const std::string& model_name) {
  TANDEM_CHECK(has_hf_form(model_name), "--model ", model_name, " has no form in Hugging Face transformers");
  if (among(model_name, models::Gpt2Config::preset_names())) return gpt2_json(models::Gpt2Config::preset(model_name)).dump();
  return llama_json(models::LlamaConfig::preset(model_name)).dump();
}

void write_hf_folder(const std::string& dir, models::Sequence& model, const std::string& model_name,
                     int64_t vocab_size, const std::map<std::string, std::string>& metadata, double dropout,
                     double max_shard_bytes) {
  TANDEM_CHECK(has_hf_form(model_name), "--model ", model_name, " has no form in Hugging Face transformers");
  if (among(model_name, models::Gpt2Config::preset_names())) {
    auto c = models::Gpt2Config::preset(model_name).with_vocabulary(vocab_size);
    c.dropout = dropout;
    write_hf_folder(dir, model, c, metadata, max_shard_bytes);
  } else {
    write_hf_folder(dir, model, models::LlamaConfig::preset(model_name).with_vocabulary(vocab_size), metadata,
                    max_shard_bytes);
  }
}

void load_hf_weights(const std::string& path, models::Sequence& model, const std::string& model_name,
                     int64_t vocab_size) {
  TANDEM_CHECK(has_hf_form(model_name), "--model ", model_name, " has no form in Hugging Face transformers");
  if (among(model_name, models::Gpt2Config::preset_names())) {
    load_hf_weights(path, model, models::Gpt2Config::preset(model_name).with_vocabulary(vocab_size));
  } else {
    load_hf_weights(path, model, models::LlamaConfig::preset(model_name).with_vocabulary(vocab_size));
  }
}

void check_weight_files(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return;
  if (!std::filesystem::exists(path + "/model.safetensors.index.json", ec)) return;
  for (const auto& [name, shard] : read_index(path)) {
    TANDEM_CHECK(std::filesystem::is_regular_file(path + "/" + shard, ec), path,
                 "/model.safetensors.index.json: names ", shard, " for ", name, ", which is not in the folder");
  }
}

SafetensorsFile read_weights_or_folder(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return read_safetensors(path);
  const std::string index = path + "/model.safetensors.index.json";
  if (!std::filesystem::exists(index, ec)) return read_safetensors(path + "/model.safetensors");
  SafetensorsFile file;
  file.tensors = read_folder(path, &file.metadata);
  return file;
}

bool has_hf_names(const SafetensorsFile& file) {
  for (const auto& [name, t] : file.tensors) {
    for (const char* prefix : {"transformer.", "model.", "lm_head.", "wte.", "wpe."}) {
      if (name.rfind(prefix, 0) == 0) return true;
    }
  }
  return false;
}

}  // namespace tandem::checkpoint
