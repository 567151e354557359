#include "tandem/models/llama.h"

#include <cmath>
#include <map>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::models {

namespace {

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
    return std::map<std::string, LlamaConfig>{{"llama-tiny", tiny}, {"llama-3.2-1b", one_b}};
  }();
  return all;
}

void init_llama_normal(torch::Tensor& t) {
  torch::NoGradGuard no_grad;
  t.normal_(0.0, 0.02);
}

torch::nn::Linear linear(int64_t in, int64_t out) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(false));
  init_llama_normal(l->weight);
  return l;
}

// transformers' inverse frequencies, in float32 (Note [rotary positions in
// float32]), with Llama 3's scaling when configured. Python's `s / t` is
// t.reciprocal() * s (two roundings), not ATen's s / t: written so here.
torch::Tensor inverse_frequencies(const LlamaConfig& c) {
  const int64_t dim = c.head_dim();
  auto exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) / dim;
  auto inv_freq = torch::pow(c.rope_theta, exponents).reciprocal() * 1.0;
  if (c.rope_factor == 0) return inv_freq;
  const double factor = c.rope_factor, low = c.rope_low_freq_factor, high = c.rope_high_freq_factor;
  const double old_context = static_cast<double>(c.rope_original_max_positions);
  const double low_freq_wavelen = old_context / low, high_freq_wavelen = old_context / high;
  auto wavelen = inv_freq.reciprocal() * (2 * M_PI);
  auto scaled = torch::where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq);
  auto smooth = (wavelen.reciprocal() * old_context - low) / (high - low);
  auto smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  auto medium = (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return torch::where(medium, smoothed, scaled);
}

torch::Tensor rotate_half(const torch::Tensor& x) {
  auto halves = x.chunk(2, -1);
  return torch::cat({-halves[1], halves[0]}, -1);
}

}  // namespace

LlamaConfig LlamaConfig::preset(const std::string& name) {
  auto it = llama_presets().find(name);
  if (it == llama_presets().end()) {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    TANDEM_CHECK_USAGE(false, "unknown LLaMA size '", name, "' (known: ", known, ")");
  }
  return it->second;
}

std::vector<std::string> LlamaConfig::preset_names() { return {"llama-tiny", "llama-3.2-1b"}; }

void LlamaConfig::check() const {
  TANDEM_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_layers > 0 && num_heads > 0 &&
                   num_kv_heads > 0 && max_positions > 0,
               "LLaMA: sizes must be positive");
  TANDEM_CHECK(hidden_size % num_heads == 0, "LLaMA: ", num_heads, " heads do not divide the width ", hidden_size);
  TANDEM_CHECK(head_dim() % 2 == 0, "LLaMA: rotary positions need an even head size, got ", head_dim());
  TANDEM_CHECK(num_heads % num_kv_heads == 0, "LLaMA: ", num_kv_heads, " key/value heads do not divide the ",
               num_heads, " heads");
  TANDEM_CHECK(rope_factor == 0 || (rope_factor > 0 && rope_high_freq_factor > rope_low_freq_factor),
               "LLaMA: rotary scaling needs a positive factor and high_freq_factor > low_freq_factor");
}

RmsNormImpl::RmsNormImpl(int64_t size, double eps) : size_(size), eps_(eps) { reset(); }

void RmsNormImpl::reset() { weight = register_parameter("weight", torch::ones({size_})); }

torch::Tensor RmsNormImpl::forward(const torch::Tensor& x) {
  const auto wide = at::promote_types(x.scalar_type(), torch::kFloat32);
  auto h = x.to(wide);
  h = h * torch::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * h.to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaAttentionImpl::reset() {
  const int64_t c = config_.hidden_size, d = config_.head_dim();
  q_proj = register_module("q_proj", linear(c, config_.num_heads * d));
  k_proj = register_module("k_proj", linear(c, config_.num_kv_heads * d));
  v_proj = register_module("v_proj", linear(c, config_.num_kv_heads * d));
  o_proj = register_module("o_proj", linear(config_.num_heads * d, c));
  inv_freq_ = inverse_frequencies(config_);
  rotary_ = {};
}

std::pair<torch::Tensor, torch::Tensor> LlamaAttentionImpl::rotary(int64_t past, int64_t t, torch::ScalarType dtype,
                                                                   const torch::Device& device) {
  auto& r = rotary_;
  if (r.past == past && r.t == t && r.parts == context.parts && r.cos.defined() && r.cos.scalar_type() == dtype &&
      r.cos.device() == device) {
    return {r.cos, r.sin};
  }
  // Note [rotary positions in float32]; under cp the positions held (Note [context split]).
  torch::NoGradGuard no_grad;
  const auto positions = context.positions ? context.positions(t, device)
                                           : torch::arange(past, past + t, torch::TensorOptions().device(device));
  if (inv_freq_.device() != device) inv_freq_ = inv_freq_.to(device);
  auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;
  auto angles = torch::cat({freqs, freqs}, -1);
  r.cos = angles.cos().to(dtype).unsqueeze(0).unsqueeze(0);  // [1, 1, T, D]
  r.sin = angles.sin().to(dtype).unsqueeze(0).unsqueeze(0);
  r.past = past;
  r.t = t;
  r.parts = context.parts;
  return {r.cos, r.sin};
}

torch::Tensor LlamaAttentionImpl::attend(const torch::Tensor& x, KvCache* cache) {
  // Under sequence parallelism `x` holds part of the sequence, `in` all of it.
  const auto in = split.in(x);
  const int64_t b = in.size(0), t = in.size(1), d = config_.head_dim();
  const int64_t h = config_.num_heads, kv = config_.num_kv_heads;
  const int64_t past = cache ? cache->length() : 0;
  TANDEM_CHECK(past + t * context.parts <= config_.max_positions, "LLaMA: a sequence of ", past + t * context.parts,
               " tokens is longer than the model's ", config_.max_positions, " positions");
  TANDEM_CHECK(!context.split() || cache == nullptr, "LLaMA: decoding with a cache under context parallelism");
  // The heads from the widths: a split region holds some of them, its
  // key/value heads in the same proportion.
  const int64_t local_heads = q_proj->weight.size(0) / d, local_kv = k_proj->weight.size(0) / d;
  auto q = q_proj->forward(in).view({b, t, local_heads, d}).transpose(1, 2);
  auto k = k_proj->forward(in).view({b, t, local_kv, d}).transpose(1, 2);
  auto v = v_proj->forward(in).view({b, t, local_kv, d}).transpose(1, 2);
  const auto [cos, sin] = rotary(past, t, x.scalar_type(), x.device());
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  if (cache) std::tie(k, v) = cache->append(k, v);  // kept per key/value head
  if (kv != h && !context.split()) {  // each key/value head serves h / kv query heads (the ring repeats its own)
    k = k.repeat_interleave(h / kv, 1);
    v = v.repeat_interleave(h / kv, 1);
  }
  const double scale = std::pow(static_cast<double>(d), -0.5);
  auto y = cache             ? cached_attention(q, k, v, 0.0, scale)
           : context.split() ? context.attend(q, k, v)  // the default scale, d^-0.5
                             : at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                                /*is_causal=*/true, scale);
  return split.out(o_proj->forward(y.transpose(1, 2).contiguous().view({b, t, local_heads * d})));
}

LlamaMlpImpl::LlamaMlpImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaMlpImpl::reset() {
  gate_proj = register_module("gate_proj", linear(config_.hidden_size, config_.intermediate_size));
  up_proj = register_module("up_proj", linear(config_.hidden_size, config_.intermediate_size));
  down_proj = register_module("down_proj", linear(config_.intermediate_size, config_.hidden_size));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  const auto in = split.in(x);
  return split.out(down_proj->forward(torch::silu(gate_proj->forward(in)) * up_proj->forward(in)));
}

LlamaLayerImpl::LlamaLayerImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaLayerImpl::reset() {
  self_attn = register_module("self_attn", LlamaAttention(config_));
  mlp = register_module("mlp", LlamaMlp(config_));
  input_layernorm = register_module("input_layernorm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
}

torch::Tensor LlamaLayerImpl::run(torch::Tensor x, KvCache* cache) {
  x = x + self_attn->attend(input_layernorm->forward(x), cache);
  return x + mlp->forward(post_attention_layernorm->forward(x));
}

LlamaEmbeddingImpl::LlamaEmbeddingImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaEmbeddingImpl::reset() {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(config_.vocab_size, config_.hidden_size));
  init_llama_normal(embed_tokens->weight);
}

torch::Tensor LlamaEmbeddingImpl::forward(torch::Tensor tokens) {
  TANDEM_CHECK(tokens.dim() == 2, "LLaMA: expected tokens [batch, sequence], got ", tokens.sizes());
  return split.lookup(embed_tokens->weight, tokens);
}

LlamaHeadImpl::LlamaHeadImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaHeadImpl::reset() {
  norm = register_module("norm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
  if (!config_.tie_embeddings) lm_head = register_module("lm_head", linear(config_.hidden_size, config_.vocab_size));
}

torch::Tensor LlamaHeadImpl::forward(torch::Tensor x) {
  x = split.in(norm->forward(x));
  if (lm_head) return lm_head->forward(x);
  TANDEM_CHECK(tied_.defined(), "LLaMA: the tied head is not bound to a token embedding (LlamaHeadImpl::tie)");
  return torch::linear(x, tied_);
}

Sequence llama(const LlamaConfig& config) {
  config.check();
  Sequence model;
  LlamaEmbedding embed(config);
  model->push_back("embed", embed);
  for (int64_t i = 0; i < config.num_layers; ++i) model->push_back("l" + std::to_string(i), LlamaLayer(config));
  model->push_back("head", LlamaHead(config));
  if (config.tie_embeddings) model->tie(model->size() - 1, "embed.embed_tokens.weight");
  return model;
}

std::string llama_hf_name(const std::string& name) {
  if (name.rfind("embed.", 0) == 0) return "model." + name.substr(6);
  if (name == "head.lm_head.weight") return "lm_head.weight";
  if (name.rfind("head.", 0) == 0) return "model." + name.substr(5);
  if (name.size() > 1 && name[0] == 'l') {
    const auto dot = name.find('.');
    if (dot != std::string::npos && dot > 1 && name.find_first_not_of("0123456789", 1) == dot) {
      return "model.layers." + name.substr(1, dot - 1) + name.substr(dot);
    }
  }
  TANDEM_CHECK(false, "LLaMA: '", name, "' is not a tensor of the model");
  return {};
}

}  // namespace tandem::models
