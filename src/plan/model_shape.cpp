// Registry language models as the planner sees them (model_shape.h).
#include "tandem/plan/model_shape.h"

#include <algorithm>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::plan {
namespace {

ModelShape gpt2_shape(const std::string& name, int64_t vocab) {
  const auto c = models::Gpt2Config::preset(name);
  ModelShape s;
  s.name = name;
  s.layers = c.n_layer;
  s.hidden = c.n_embd;
  s.heads = s.kv_heads = c.n_head;
  s.head_dim = c.n_embd / c.n_head;
  s.ffn = 4 * c.n_embd;
  s.vocab = vocab > 0 && !c.fixed_vocabulary ? vocab : c.vocab_size;
  s.context = c.n_positions;
  s.tied = true;
  const int64_t d = s.hidden;
  // ln_1, c_attn, c_proj, ln_2, c_fc, mlp's c_proj: a weight and a bias each.
  s.layer_parameters = 12 * d * d + 13 * d;
  s.layer_tensors = 12;
  // Cut by tp: c_attn's weight and bias, c_proj's weight, c_fc's weight and
  // bias, the MLP's c_proj weight (the norms and the output biases whole).
  s.layer_cut_parameters = 3 * d * d + 3 * d + d * d + 4 * d * d + 4 * d + 4 * d * d;
  s.embedding_parameters = s.vocab * d + s.context * d;  // tokens, learned positions
  s.embedding_tensors = 2;
  s.norm_parameters = 2 * d;
  s.norm_tensors = 2;
  return s;
}

ModelShape llama_shape(const std::string& name, int64_t vocab) {
  const auto c = models::LlamaConfig::preset(name);
  ModelShape s;
  s.name = name;
  s.llama = true;
  s.layers = c.num_layers;
  s.hidden = c.hidden_size;
  s.heads = c.num_heads;
  s.kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim();
  s.ffn = c.intermediate_size;
  s.vocab = vocab > 0 && !c.fixed_vocabulary ? vocab : c.vocab_size;
  s.context = c.max_positions;
  s.tied = c.tie_embeddings;
  s.experts = c.num_experts;
  s.experts_per_token = c.experts_per_token;
  s.expert_ffn = c.expert_intermediate_size;
  const int64_t d = s.hidden, q = s.heads * s.head_dim, kv = s.kv_heads * s.head_dim;
  const int64_t attention = 2 * d * q + 2 * d * kv;
  const int64_t mlp = s.experts > 0 ? s.experts * d + 3 * s.experts * s.expert_ffn * d : 3 * d * s.ffn;
  const int64_t qk_norm = c.qk_norm ? 2 * s.head_dim : 0;
  s.layer_parameters = attention + mlp + qk_norm + 2 * d;
  s.layer_tensors = 4 + (s.experts > 0 ? 4 : 3) + 2 + (c.qk_norm ? 2 : 0);
  s.layer_cut_parameters = attention + (s.experts > 0 ? 3 * s.experts * s.expert_ffn * d : mlp);
  s.layer_partial_parameters = (s.experts > 0 ? s.experts * d : 0) + qk_norm;
  s.embedding_parameters = s.vocab * d;
  s.embedding_tensors = 1;
  s.norm_parameters = d;
  s.norm_tensors = 1;
  s.head_parameters = s.tied ? 0 : s.vocab * d;
  s.head_tensors = s.tied ? 0 : 1;
  return s;
}

}  // namespace

std::string image_models() {
  std::string out;
  for (const auto& n : models::model_names()) {
    if (!models::is_language_model(n)) out += (out.empty() ? "" : ", ") + n;
  }
  return out;
}

bool is_image_model(const std::string& model) {
  const auto names = models::model_names();
  return std::find(names.begin(), names.end(), model) != names.end() && !models::is_language_model(model);
}

double ModelShape::flops_per_token(int64_t seq_len) const {
  models::ModelOptions o;
  o.vocab_size = vocab;
  o.seq_len = seq_len;
  return models::model_traits(name).flops_per_token(o);
}

double ModelShape::activations_norms_per_token() const {
  // The two norms' inputs (the residual stream); LLaMA's RMSNorm, composed
  // of products, keeps its normalised input too.
  return (llama ? 4.0 : 2.0) * double(hidden);
}

double ModelShape::activations_inside_per_token() const {
  const double d = double(hidden), q = double(heads * head_dim), kv = double(kv_heads * head_dim);
  // q, k, v (rotated for LLaMA: the rotation's inputs too), attention's
  // output and the output projection's input.
  const double attention = llama ? 2 * (q + 2 * kv) + 2 * q : q + 2 * kv + 2 * q;
  // GPT-2: c_fc's output (GELU's input) and c_proj's input, 4d each.
  // LLaMA: gate's and up's outputs, SiLU's, and down's input; per chosen
  // expert for a mixture, with the row it got and the row it gave (kept
  // for its product with the routing weight), and the router's
  // probabilities.
  const double mlp = !llama         ? 2.0 * double(ffn)
                     : experts > 0 ? double(experts_per_token) * (4.0 * double(expert_ffn) + 2.0 * d) + double(experts)
                                   : 4.0 * double(ffn);
  return attention + mlp;
}

ModelShape model_shape(const std::string& model, int64_t vocab) {
  TANDEM_CHECK_USAGE(vocab >= 0 && vocab <= (int64_t(1) << 31), "--vocab-size ", vocab,
                     ": expected a vocabulary of at most 2^31 tokens");
  models::resolve_model_name(model);  // "hf:DIR" (Note [model resolvers])
  const auto gpt2 = models::Gpt2Config::preset_names();
  const auto llama = models::LlamaConfig::preset_names();
  if (std::find(gpt2.begin(), gpt2.end(), model) != gpt2.end()) return gpt2_shape(model, vocab);
  if (std::find(llama.begin(), llama.end(), model) != llama.end()) return llama_shape(model, vocab);
  std::string known;
  for (const auto& n : gpt2) known += (known.empty() ? "" : ", ") + n;
  for (const auto& n : llama) known += ", " + n;
  TANDEM_CHECK_USAGE(false, "--model ", model, ": tandem plan plans the language models (", known,
                     ") and the image classifiers (", image_models(), ")");
  return {};
}

ModelShape image_model_shape(const std::string& model, int64_t channels, int64_t image_size, int64_t classes,
                             bool float64) {
  ModelShape s;
  s.name = model;
  s.image = measure_image_model(model, channels, image_size, classes, float64);
  s.layers = static_cast<int64_t>(s.image->layer_numels.size());
  return s;
}

}  // namespace tandem::plan
