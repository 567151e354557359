// GPT-2's and LLaMA's presets as registry factories (language_models.h):
// the preset's shape with the data's vocabulary, checked against the
// sequence length trained on.
#include "language_models.h"

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/util/check.h"

namespace tandem::models {
namespace {

void check_sizes(const std::string& name, const ModelOptions& o, int64_t context, int64_t fixed_vocabulary) {
  TANDEM_CHECK_USAGE(o.vocab_size > 0, name, ": a language model needs a vocabulary (token data, or --vocab-size)");
  TANDEM_CHECK_USAGE(o.seq_len <= context, "--seq-len ", o.seq_len, ": ", name, " takes sequences of at most ",
                     context, " tokens");
  TANDEM_CHECK_USAGE(fixed_vocabulary == 0 || o.vocab_size <= fixed_vocabulary, name, ": the data's vocabulary of ",
                     o.vocab_size, " tokens does not fit the model's ", fixed_vocabulary);
}

// 6 FLOPs per multiplying weight and token, plus attention's 12 L d T
// (ModelTraits::flops_per_token).
double flops(double multiplying_weights, int64_t layers, int64_t width, int64_t seq_len) {
  return 6.0 * multiplying_weights + 12.0 * double(layers) * double(width) * double(seq_len);
}

Gpt2Config gpt2_config(const std::string& name, const ModelOptions& o) {
  auto c = Gpt2Config::preset(name).with_vocabulary(o.vocab_size);
  c.dropout = o.dropout;
  return c;
}

double gpt2_flops(const std::string& name, const ModelOptions& o) {
  const auto c = gpt2_config(name, o);
  const double d = double(c.n_embd);
  // The token embedding (the tied head's weight), the blocks, ln_f; not
  // the learned positions, which only are looked up.
  const double weights = double(c.vocab_size) * d + double(c.n_layer) * (12 * d * d + 13 * d) + 2 * d;
  return flops(weights, c.n_layer, c.n_embd, o.seq_len);
}

LlamaConfig llama_config(const std::string& name, const ModelOptions& o) {
  return LlamaConfig::preset(name).with_vocabulary(o.vocab_size);
}

double llama_flops(const std::string& name, const ModelOptions& o) {
  const auto c = llama_config(name, o);
  const double d = double(c.hidden_size), q = double(c.num_heads * c.head_dim());
  const double kv = double(c.num_kv_heads * c.head_dim());
  // A token multiplies by the router and its k experts' weights, not by all of them.
  const double mlp = c.has_experts() ? double(c.num_experts) * d +
                                           double(c.experts_per_token) * 3 * d * double(c.expert_intermediate_size)
                                     : 3 * d * double(c.intermediate_size);
  const double layer = 2 * d * q + 2 * d * kv + mlp + 2 * d;
  // The head multiplies (tied or not); the embedding's own lookups do not.
  const double weights = double(c.vocab_size) * d + double(c.num_layers) * layer + d;
  return flops(weights, c.num_layers, c.num_heads * c.head_dim(), o.seq_len);
}

int64_t gpt2_parameters(const std::string& name, const ModelOptions& o) {
  const auto c = gpt2_config(name, o);
  const int64_t d = c.n_embd;
  return c.vocab_size * d + c.n_positions * d + c.n_layer * (12 * d * d + 13 * d) + 2 * d;
}

int64_t llama_parameters(const std::string& name, const ModelOptions& o) {
  const auto c = llama_config(name, o);
  const int64_t d = c.hidden_size, hd = c.head_dim();
  const int64_t attention = 2 * d * c.num_heads * hd + 2 * d * c.num_kv_heads * hd + (c.qk_norm ? 2 * hd : 0) +
                            (c.qkv_bias ? (c.num_heads + 2 * c.num_kv_heads) * hd : 0) + (c.o_bias ? d : 0);
  const int64_t mlp = c.has_experts() ? c.num_experts * d + 3 * c.num_experts * c.expert_intermediate_size * d
                                      : 3 * d * c.intermediate_size + (c.mlp_bias ? 2 * c.intermediate_size + d : 0);
  return c.vocab_size * d * (c.tie_embeddings ? 1 : 2) + c.num_layers * (attention + mlp + 2 * d) + d;
}

// embed, <prefix>0 .. <prefix>L-1, head: the Sequence gpt2() and llama() build.
std::vector<std::string> layer_names(const std::string& prefix, int64_t layers) {
  std::vector<std::string> names{"embed"};
  for (int64_t i = 0; i < layers; ++i) names.push_back(prefix + std::to_string(i));
  names.push_back("head");
  return names;
}

using LanguageEntry = std::pair<ModelFactory, ModelTraits>;

// One model: its factory checks the sizes against its context first.
LanguageEntry entry(const std::string& name, int64_t context, int64_t fixed_vocabulary,
            std::function<Sequence(const ModelOptions&)> build, std::function<double(const ModelOptions&)> flops,
            std::vector<std::string> layers, bool tied, std::vector<std::pair<std::string, int64_t>> divisors,
            int64_t experts, std::function<int64_t(const ModelOptions&)> parameters) {
  ModelFactory factory = [name, context, fixed_vocabulary, build](const ModelOptions& o) {
    check_sizes(name, o, context, fixed_vocabulary);
    return build(o);
  };
  return {std::move(factory), ModelTraits{ModelKind::kLanguageModel, context, std::move(flops), std::move(layers),
                                          tied, std::move(divisors), experts, std::move(parameters)}};
}

LanguageEntry gpt2_entry(const std::string& name) {
  const auto c = Gpt2Config::preset(name);
  return entry(name, c.n_positions, c.fixed_vocabulary ? c.vocab_size : 0,
               [name](const ModelOptions& o) { return gpt2(gpt2_config(name, o)); },
               [name](const ModelOptions& o) { return gpt2_flops(name, o); }, layer_names("h", c.n_layer), true,
               {{"heads", c.n_head}}, 0, [name](const ModelOptions& o) { return gpt2_parameters(name, o); });
}

LanguageEntry llama_entry(const std::string& name) {
  const auto c = LlamaConfig::preset(name);
  return entry(name, c.context(), c.fixed_vocabulary ? c.vocab_size : 0,
               [name](const ModelOptions& o) { return llama(llama_config(name, o)); },
               [name](const ModelOptions& o) { return llama_flops(name, o); }, layer_names("l", c.num_layers),
               c.tie_embeddings, {{"heads", c.num_heads}, {"key/value heads", c.num_kv_heads}}, c.num_experts,
               [name](const ModelOptions& o) { return llama_parameters(name, o); });
}

}  // namespace

std::map<std::string, std::pair<ModelFactory, ModelTraits>> language_models() {
  std::map<std::string, LanguageEntry> all;
  for (const auto& name : Gpt2Config::preset_names()) all.emplace(name, gpt2_entry(name));
  for (const auto& name : LlamaConfig::preset_names()) all.emplace(name, llama_entry(name));
  return all;
}

// The registry is made from the presets on its first use: made before the
// config is added, it does not take the added name for a built-in one.
void add_gpt2_model(const std::string& name, const Gpt2Config& config) {
  model_names();
  Gpt2Config::add_preset(name, config);
  auto [factory, traits] = gpt2_entry(name);
  register_model(name, std::move(factory), std::move(traits));
}

void add_llama_model(const std::string& name, const LlamaConfig& config) {
  model_names();
  LlamaConfig::add_preset(name, config);
  auto [factory, traits] = llama_entry(name);
  register_model(name, std::move(factory), std::move(traits));
}

}  // namespace tandem::models
