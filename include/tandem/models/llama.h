// tandem/models/llama.h: LLaMA (Touvron et al. 2023; Llama 3) as Hugging
// Face transformers' LlamaForCausalLM computes it.
//
//   auto model = models::llama(models::LlamaConfig::preset("llama-tiny"));
//   auto logits = model->forward(tokens);  // [B, T] int64 -> [B, T, vocab]
//
// A Sequence of the pipeline's units: "embed" (the token embedding), "l0" ..
// "l<L-1>" (decoder layers: RMSNorm, attention with rotary positions and
// grouped-query heads through scaled_dot_product_attention, RMSNorm, a
// SwiGLU MLP; no biases), "head" (the last RMSNorm and the output
// projection: its own weight, or tied to the embedding as Llama 3.2 1B
// does, Note [tied embedding] in models/gpt2.h). Every tensor maps to
// transformers' name by llama_hf_name.
//
// Note [rotary positions in float32]: the rotary angles are computed as
// transformers computes them, in float32 whatever the model's dtype
// (inverse frequencies base^(-2i/d), Llama 3's long-context scaling where
// configured, angle = position * frequency, cos and sin), then cast to
// the activations' dtype; a float64 model is exact to the bit given those
// angles. RMSNorm normalises in float32 for half and bfloat16 inputs, as
// transformers does, and in the input's own precision when wider (float64:
// transformers would round it to float32).
//
// The same decoder is Mistral's, Qwen2's and Qwen3's (biases on the
// attention's projections, RMSNorms of each query and key head before the
// rotary angles, a head size of its own), and Mixtral's and Qwen3-MoE's
// where the config says so: each layer's MLP a mixture of experts
// (models/moe.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn.h>

#include "tandem/models/decoding.h"
#include "tandem/models/moe.h"
#include "tandem/models/sequence.h"
#include "tandem/models/split_region.h"

namespace tandem::models {

// Which transformers class computes the same function, and so the names
// and config.json of its weights.
enum class LlamaFamily { kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen3Moe };

struct LlamaConfig {
  LlamaFamily family = LlamaFamily::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_layers = 32;
  int64_t num_heads = 32;
  int64_t num_kv_heads = 32;  // grouped-query attention: fewer key/value heads
  int64_t max_positions = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000;
  // Llama 3's rotary scaling ("llama3" in transformers); factor 0: none.
  double rope_factor = 0, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_max_positions = 8192;
  bool tie_embeddings = false;
  int64_t head_size = 0;  // 0: hidden_size / num_heads (Qwen3 sets its own)
  bool qk_norm = false;   // Qwen3: an RMSNorm over each query and key head
  // Biases: of the query, key and value projections (Qwen2; LLaMA's and
  // Qwen3's attention_bias), of the output projection (attention_bias),
  // of the MLP's three (LLaMA's mlp_bias). Initialised to 0.
  bool qkv_bias = false, o_bias = false, mlp_bias = false;
  // Mistral's attention window (0: none). Sequences are held to it (the
  // model's context is the smaller of it and max_positions), where a
  // window changes nothing.
  int64_t sliding_window = 0;
  // The vocabulary is this config's own (a model read from transformers'
  // config.json), which the data's must fit; a preset's is the data's.
  bool fixed_vocabulary = false;
  // A mixture of experts in every layer for the MLP where num_experts > 0
  // (models/moe.h): each token to experts_per_token of them, each an MLP
  // of expert_intermediate_size features.
  int64_t num_experts = 0, experts_per_token = 2, expert_intermediate_size = 0;
  bool normalize_top_k = true;

  // llama-tiny (4 layers, width 128, 4 heads over 2 key/value heads,
  // untied: tests and CPU demos), llama-3.2-1b (Meta's Llama 3.2 1B: 16
  // layers, width 2048, 32 heads over 8, tied, Llama 3 rotary scaling),
  // mixtral-tiny and mixtral-8x7b (8 experts, top 2), qwen3-moe-tiny and
  // qwen3-30b-a3b (128 experts, top 8; q/k norms): llama_presets.cpp.
  // A name resolve_model_name (models/registry.h) knows, as "hf:DIR", is
  // found too once resolved.
  static LlamaConfig preset(const std::string& name);
  static std::vector<std::string> preset_names();
  // Adds `config` under `name` for preset() (add_llama_model in
  // models/registry.h registers the model too); a name taken is refused.
  static void add_preset(const std::string& name, const LlamaConfig& config);
  // This config with the data's vocabulary, unless fixed_vocabulary.
  LlamaConfig with_vocabulary(int64_t vocab) const;
  int64_t head_dim() const { return head_size > 0 ? head_size : hidden_size / num_heads; }
  // The longest sequence the model takes (Mistral's window included).
  int64_t context() const {
    return sliding_window > 0 && sliding_window < max_positions ? sliding_window : max_positions;
  }
  bool has_experts() const { return num_experts > 0; }
  MoeConfig moe() const {
    return {hidden_size, expert_intermediate_size, num_experts, experts_per_token, normalize_top_k};
  }
  // Throws tandem::Error for sizes that do not fit (heads not dividing the
  // width, key/value heads not dividing the heads, non-positive sizes).
  void check() const;
};

// x / sqrt(mean(x^2) + eps) * weight (transformers' LlamaRMSNorm).
class RmsNormImpl : public torch::nn::Cloneable<RmsNormImpl> {
 public:
  RmsNormImpl(int64_t size, double eps);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  int64_t size_;
  double eps_;
};
TORCH_MODULE(RmsNorm);

class LlamaAttentionImpl : public torch::nn::Cloneable<LlamaAttentionImpl> {
 public:
  explicit LlamaAttentionImpl(LlamaConfig config);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return attend(x, nullptr); }
  // With a cache: at the positions after it, over its keys and values,
  // appending x's (models/decoding.h).
  torch::Tensor attend(const torch::Tensor& x, KvCache* cache);
  const LlamaConfig& config() const { return config_; }
  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  RmsNorm q_norm{nullptr}, k_norm{nullptr};  // qk_norm only, over head_dim
  SplitRegion split;  // Note [split regions]
  ContextSplit context;  // Note [context split]

 private:
  // The rotary cos and sin of positions [past, past + t) (under cp, of
  // the t positions this rank holds), in `dtype` on `device`: made once
  // and kept while the next call asks the same (every training step
  // does), so a step computes no angles.
  std::pair<torch::Tensor, torch::Tensor> rotary(int64_t past, int64_t t, torch::ScalarType dtype,
                                                 const torch::Device& device);

  LlamaConfig config_;
  torch::Tensor inv_freq_;  // float32, Note [rotary positions in float32]
  struct Rotary {
    int64_t past = -1, t = -1, parts = 1;  // parts: context.parts they were made for
    torch::Tensor cos, sin;  // [1, 1, t, head_dim]
  } rotary_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Cloneable<LlamaMlpImpl> {
 public:
  explicit LlamaMlpImpl(LlamaConfig config);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  SplitRegion split;  // Note [split regions]

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaMlp);

class LlamaLayerImpl : public torch::nn::Cloneable<LlamaLayerImpl>, public CachedLayer {
 public:
  explicit LlamaLayerImpl(LlamaConfig config);
  void reset() override;
  torch::Tensor forward(torch::Tensor x) { return run(x, nullptr); }
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache& cache) override { return run(x, &cache); }
  RmsNorm input_layernorm{nullptr}, post_attention_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaMlp mlp{nullptr};  // registered as "mlp": the one of these two the config has
  SparseMoe moe{nullptr};

 private:
  torch::Tensor run(torch::Tensor x, KvCache* cache);
  LlamaConfig config_;
};
TORCH_MODULE(LlamaLayer);

class LlamaEmbeddingImpl : public torch::nn::Cloneable<LlamaEmbeddingImpl>, public PositionedEmbedding {
 public:
  explicit LlamaEmbeddingImpl(LlamaConfig config);
  void reset() override;
  torch::Tensor forward(torch::Tensor tokens);
  // Positions are the attention's (rotary), so the offset changes nothing here.
  torch::Tensor forward_at(const torch::Tensor& tokens, int64_t /*offset*/) override { return forward(tokens); }
  torch::nn::Embedding embed_tokens{nullptr};
  SplitLookup split;  // Note [split regions]

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaEmbedding);

class LlamaHeadImpl : public torch::nn::Cloneable<LlamaHeadImpl>, public TiedWeightUser {
 public:
  explicit LlamaHeadImpl(LlamaConfig config);
  void reset() override;
  // With tie_embeddings (Note [tied embedding]): the output weight.
  void tie(torch::Tensor embedding_weight) override { tied_ = std::move(embedding_weight); }
  const torch::Tensor& tied() const override { return tied_; }
  torch::Tensor forward(torch::Tensor x);
  RmsNorm norm{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied
  SplitRegion split;  // enter only: the logits of this rank's vocabulary rows

 private:
  LlamaConfig config_;
  torch::Tensor tied_;
};
TORCH_MODULE(LlamaHead);

// The model, initialised as transformers initialises LLaMA: linear and
// embedding weights N(0, 0.02), RMSNorm weights 1.
Sequence llama(const LlamaConfig& config);

// transformers' name of a tensor of llama(): embed.embed_tokens.weight ->
// model.embed_tokens.weight, l3.self_attn.q_proj.weight ->
// model.layers.3.self_attn.q_proj.weight, head.norm.weight ->
// model.norm.weight, head.lm_head.weight -> lm_head.weight.
std::string llama_hf_name(const std::string& name);

// The names under which transformers saves a tensor of llama(config): one,
// or for an experts' 3-D weight one per expert (its slices along dim 0), as
// save_pretrained writes them: Mixtral's l3.mlp.experts.gate_proj ->
// model.layers.3.block_sparse_moe.experts.{0..E-1}.w1.weight (up_proj w3,
// down_proj w2, the router block_sparse_moe.gate.weight), Qwen3-MoE's ->
// model.layers.3.mlp.experts.{e}.gate_proj.weight.
std::vector<std::string> llama_hf_names(const std::string& name, const LlamaConfig& config);

}  // namespace tandem::models
