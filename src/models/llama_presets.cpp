// LLaMA's presets and the config's checks (llama.h): the dense LLaMAs, and
// the Mixtral and Qwen3-MoE shapes the same decoder computes with experts.
#include <map>
#include <mutex>

#include "tandem/models/llama.h"
#include "added_configs.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::models {

namespace {

LlamaConfig mixtral(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads, int64_t kv) {
  LlamaConfig c;
  c.family = LlamaFamily::kMixtral;
  c.vocab_size = 32000;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;  // Mixtral's intermediate_size is each expert's
  c.expert_intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv;
  c.num_experts = 8;
  c.experts_per_token = 2;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 1e6;
  return c;
}

// Meta's Llama 3 and 3.1 shapes (their config.json): GQA over 8 key/value
// heads, vocabulary 128,256, rotary base 500,000, untied.
LlamaConfig llama3(int64_t hidden, int64_t intermediate, int64_t layers, int64_t heads) {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = intermediate;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = 8;
  c.max_positions = 8192;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000;
  return c;
}

const std::map<std::string, LlamaConfig>& llama_presets() {
  static const std::map<std::string, LlamaConfig> all = [] {
    LlamaConfig tiny;
    tiny.vocab_size = 32000;
    tiny.hidden_size = 128;
    tiny.intermediate_size = 352;
    tiny.num_layers = 4;
    tiny.num_heads = 4;
    tiny.num_kv_heads = 2;
    tiny.max_positions = 256;
    tiny.rms_norm_eps = 1e-5;
    LlamaConfig one_b;  // Meta's Llama-3.2-1B config.json
    one_b.vocab_size = 128256;
    one_b.hidden_size = 2048;
    one_b.intermediate_size = 8192;
    one_b.num_layers = 16;
    one_b.num_heads = 32;
    one_b.num_kv_heads = 8;
    one_b.max_positions = 131072;
    one_b.rms_norm_eps = 1e-5;
    one_b.rope_theta = 500000;
    one_b.rope_factor = 32;
    one_b.rope_low_freq_factor = 1;
    one_b.rope_high_freq_factor = 4;
    one_b.rope_original_max_positions = 8192;
    one_b.tie_embeddings = true;
    auto mixtral_tiny = mixtral(128, 128, 4, 4, 2);
    mixtral_tiny.max_positions = 256;
    auto mixtral_8x7b = mixtral(4096, 14336, 32, 32, 8);  // mistralai/Mixtral-8x7B-v0.1's config.json
    mixtral_8x7b.max_positions = 32768;
    LlamaConfig qwen_tiny;
    qwen_tiny.family = LlamaFamily::kQwen3Moe;
    qwen_tiny.vocab_size = 32000;
    qwen_tiny.hidden_size = 128;
    qwen_tiny.intermediate_size = 352;  // a dense layer's; every layer here has experts
    qwen_tiny.expert_intermediate_size = 64;
    qwen_tiny.num_layers = 4;
    qwen_tiny.num_heads = 4;
    qwen_tiny.num_kv_heads = 2;
    qwen_tiny.head_size = 48;  // not width / heads, as Qwen3's own sizes
    qwen_tiny.qk_norm = true;
    qwen_tiny.num_experts = 16;
    qwen_tiny.experts_per_token = 4;
    qwen_tiny.max_positions = 256;
    qwen_tiny.rms_norm_eps = 1e-6;
    qwen_tiny.rope_theta = 1e6;
    LlamaConfig qwen_30b = qwen_tiny;  // Qwen/Qwen3-30B-A3B's config.json
    qwen_30b.vocab_size = 151936;
    qwen_30b.hidden_size = 2048;
    qwen_30b.intermediate_size = 6144;
    qwen_30b.expert_intermediate_size = 768;
    qwen_30b.num_layers = 48;
    qwen_30b.num_heads = 32;
    qwen_30b.num_kv_heads = 4;
    qwen_30b.head_size = 128;
    qwen_30b.num_experts = 128;
    qwen_30b.experts_per_token = 8;
    qwen_30b.max_positions = 40960;
    auto llama_405b = llama3(16384, 53248, 126, 128);  // Llama 3.1 405B: scaled rotary, 128K positions
    llama_405b.max_positions = 131072;
    llama_405b.rope_factor = 8;
    return std::map<std::string, LlamaConfig>{{"llama-tiny", tiny},          {"llama-3.2-1b", one_b},
                                              {"llama-3-8b", llama3(4096, 14336, 32, 32)},
                                              {"llama-3-70b", llama3(8192, 28672, 80, 64)},
                                              {"llama-3.1-405b", llama_405b},
                                              {"mixtral-tiny", mixtral_tiny}, {"mixtral-8x7b", mixtral_8x7b},
                                              {"qwen3-moe-tiny", qwen_tiny},  {"qwen3-30b-a3b", qwen_30b}};
  }();
  return all;
}

}  // namespace

using AddedLlama = internal::AddedConfigs<LlamaConfig>;

LlamaConfig LlamaConfig::preset(const std::string& name) {
  auto it = llama_presets().find(name);
  if (it != llama_presets().end()) return it->second;
  LlamaConfig found;
  // Note [model resolvers] (models/registry.h): "hf:DIR" and the like.
  if (AddedLlama::instance().find(name, &found)) return found;
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  TANDEM_CHECK_USAGE(false, "unknown LLaMA size '", name, "' (known: ", known, ")");
  return {};
}

std::vector<std::string> LlamaConfig::preset_names() {
  std::vector<std::string> names = {"llama-tiny",   "llama-3.2-1b", "llama-3-8b",     "llama-3-70b",  "llama-3.1-405b",
                                    "mixtral-tiny", "mixtral-8x7b", "qwen3-moe-tiny", "qwen3-30b-a3b"};
  AddedLlama::instance().append_names(names);
  return names;
}

void LlamaConfig::add_preset(const std::string& name, const LlamaConfig& config) {
  config.check();
  TANDEM_CHECK(llama_presets().count(name) == 0, "LLaMA: '", name, "' is a preset's name");
  AddedLlama::instance().add(name, config, "LLaMA");
}

LlamaConfig LlamaConfig::with_vocabulary(int64_t vocab) const {
  LlamaConfig c = *this;
  if (!fixed_vocabulary) c.vocab_size = vocab;
  return c;
}

void LlamaConfig::check() const {
  TANDEM_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_layers > 0 && num_heads > 0 &&
                   num_kv_heads > 0 && max_positions > 0 && head_size >= 0,
               "LLaMA: sizes must be positive");
  TANDEM_CHECK(head_size > 0 || hidden_size % num_heads == 0, "LLaMA: ", num_heads, " heads do not divide the width ",
               hidden_size);
  TANDEM_CHECK(head_dim() % 2 == 0, "LLaMA: rotary positions need an even head size, got ", head_dim());
  TANDEM_CHECK(num_heads % num_kv_heads == 0, "LLaMA: ", num_kv_heads, " key/value heads do not divide the ",
               num_heads, " heads");
  TANDEM_CHECK(rope_factor == 0 || (rope_factor > 0 && rope_high_freq_factor > rope_low_freq_factor),
               "LLaMA: rotary scaling needs a positive factor and high_freq_factor > low_freq_factor");
  TANDEM_CHECK(num_experts >= 0, "LLaMA: a negative number of experts");
  if (has_experts()) moe().check();
  const bool moe_family = family == LlamaFamily::kMixtral || family == LlamaFamily::kQwen3Moe;
  TANDEM_CHECK(!moe_family || has_experts(), "LLaMA: a Mixtral or Qwen3-MoE config without experts (num_experts 0)");
  TANDEM_CHECK(sliding_window >= 0, "LLaMA: a negative attention window");
}

}  // namespace tandem::models
