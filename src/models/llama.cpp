#include "tandem/models/llama.h"

#include <cmath>
#include <map>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::models {

namespace {

void init_llama_normal(torch::Tensor& t) {
  torch::NoGradGuard no_grad;
  t.normal_(0.0, 0.02);
}

// Weights N(0, 0.02), biases 0 (transformers' _init_weights).
torch::nn::Linear linear(int64_t in, int64_t out, bool bias = false) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(bias));
  init_llama_normal(l->weight);
  if (bias) {
    torch::NoGradGuard no_grad;
    l->bias.zero_();
  }
  return l;
}

// A row-parallel projection (Note [split regions]): the ranks' partial
// products summed by split.out, the bias (whole on every rank) added once.
torch::Tensor project_out(torch::nn::Linear& l, const torch::Tensor& x, const SplitRegion& split) {
  if (!l->bias.defined() || !split.split()) return split.out(l->forward(x));
  return split.out(torch::linear(x, l->weight)) + l->bias;
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
  q_proj = register_module("q_proj", linear(c, config_.num_heads * d, config_.qkv_bias));
  k_proj = register_module("k_proj", linear(c, config_.num_kv_heads * d, config_.qkv_bias));
  v_proj = register_module("v_proj", linear(c, config_.num_kv_heads * d, config_.qkv_bias));
  o_proj = register_module("o_proj", linear(config_.num_heads * d, c, config_.o_bias));
  if (config_.qk_norm) {
    q_norm = register_module("q_norm", RmsNorm(d, config_.rms_norm_eps));
    k_norm = register_module("k_norm", RmsNorm(d, config_.rms_norm_eps));
  }
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
  TANDEM_CHECK(past + t * context.parts <= config_.context(), "LLaMA: a sequence of ", past + t * context.parts,
               " tokens is longer than the model's ", config_.context(),
               config_.context() < config_.max_positions ? " positions (its attention window)" : " positions");
  TANDEM_CHECK(!context.split() || cache == nullptr, "LLaMA: decoding with a cache under context parallelism");
  // The heads from the widths: a split region holds some of them, its
  // key/value heads in the same proportion.
  const int64_t local_heads = q_proj->weight.size(0) / d, local_kv = k_proj->weight.size(0) / d;
  auto q = q_proj->forward(in).view({b, t, local_heads, d});
  auto k = k_proj->forward(in).view({b, t, local_kv, d});
  if (q_norm) {  // Qwen3: each head normalised before its rotary angles
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
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
  return project_out(o_proj, y.transpose(1, 2).contiguous().view({b, t, local_heads * d}), split);
}

LlamaMlpImpl::LlamaMlpImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaMlpImpl::reset() {
  const bool bias = config_.mlp_bias;
  gate_proj = register_module("gate_proj", linear(config_.hidden_size, config_.intermediate_size, bias));
  up_proj = register_module("up_proj", linear(config_.hidden_size, config_.intermediate_size, bias));
  down_proj = register_module("down_proj", linear(config_.intermediate_size, config_.hidden_size, bias));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  const auto in = split.in(x);
  return project_out(down_proj, torch::silu(gate_proj->forward(in)) * up_proj->forward(in), split);
}

LlamaLayerImpl::LlamaLayerImpl(LlamaConfig config) : config_(config) { reset(); }

void LlamaLayerImpl::reset() {
  self_attn = register_module("self_attn", LlamaAttention(config_));
  if (config_.has_experts()) {
    moe = register_module("mlp", SparseMoe(config_.moe()));
  } else {
    mlp = register_module("mlp", LlamaMlp(config_));
  }
  input_layernorm = register_module("input_layernorm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
  post_attention_layernorm =
      register_module("post_attention_layernorm", RmsNorm(config_.hidden_size, config_.rms_norm_eps));
}

torch::Tensor LlamaLayerImpl::run(torch::Tensor x, KvCache* cache) {
  x = x + self_attn->attend(input_layernorm->forward(x), cache);
  const auto h = post_attention_layernorm->forward(x);
  return x + (moe ? moe->forward(h) : mlp->forward(h));
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

std::vector<std::string> llama_hf_names(const std::string& name, const LlamaConfig& config) {
  std::string hf = llama_hf_name(name);
  if (!config.has_experts()) return {hf};
  const auto at = hf.find(".mlp.");
  if (at == std::string::npos) return {hf};
  const bool mixtral = config.family == LlamaFamily::kMixtral;
  const std::string layer = hf.substr(0, at) + (mixtral ? ".block_sparse_moe." : ".mlp.");
  const std::string rest = hf.substr(at + 5);  // gate.weight, experts.gate_proj, ...
  if (rest.rfind("experts.", 0) != 0) return {layer + rest};
  const std::string projection = rest.substr(8);
  static const std::map<std::string, std::string> mixtral_names = {
      {"gate_proj", "w1"}, {"up_proj", "w3"}, {"down_proj", "w2"}};
  TANDEM_CHECK(mixtral_names.count(projection) > 0, "LLaMA: '", name, "' is not a tensor of the model");
  const std::string leaf = (mixtral ? mixtral_names.at(projection) : projection) + ".weight";
  std::vector<std::string> names;
  for (int64_t e = 0; e < config.num_experts; ++e) names.push_back(layer + "experts." + std::to_string(e) + "." + leaf);
  return names;
}

}  // namespace tandem::models
