// tandem/models/gpt2.h: GPT-2 (Radford et al. 2019) as Hugging Face
// transformers' GPT2LMHeadModel computes it.
//
//   auto model = models::gpt2(models::Gpt2Config::preset("gpt2-tiny"));
//   auto logits = model->forward(tokens);  // [B, T] int64 -> [B, T, vocab]
//
// A Sequence of the pipeline's units: "embed" (token and learned position
// embeddings), "h0" .. "h<L-1>" (pre-LayerNorm blocks: causal attention
// through scaled_dot_product_attention, so that CUDA picks its flash or
// memory-efficient kernel, and a GELU-tanh MLP), "head" (the last
// LayerNorm, then logits against the token embedding: tied, one tensor).
// The layers keep transformers' layouts (Conv1D weights [in, out]), so
// that every tensor maps to transformers' by name alone (gpt2_hf_name).
//
// Note [tied embedding]: the head multiplies by embed.wte.weight itself;
// it registers no parameter of its own, so named_parameters() lists the
// tensor once and its gradient is the sum of both uses, as in transformers
// and nanoGPT. gpt2() records the tie in the Sequence (Sequence::tie), so
// that a clone (DataParallel's replicas) binds its head to its own copy of
// the embedding. FSDP keeps the embedding's unit gathered while the head
// runs (Note [fsdp tied weights] in parallel/fsdp.h); a pipeline over ranks
// gives the last stage a copy whose gradient is summed with the first
// stage's (Note [tied weights across stages] in engine/tied_stages.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/nn.h>

#include "tandem/models/decoding.h"
#include "tandem/models/sequence.h"
#include "tandem/models/split_region.h"

namespace tandem::models {

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;  // the longest sequence
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  double dropout = 0.0;  // embeddings, attention, residuals (transformers' three pdrops)
  double layer_norm_eps = 1e-5;
  // The vocabulary is this config's own (a model read from transformers'
  // config.json), which the data's must fit; a preset's is the data's.
  bool fixed_vocabulary = false;

  // gpt2-tiny (4 layers, 4 heads, width 128: tests and CPU demos), gpt2
  // (124M), gpt2-medium (350M), gpt2-large (774M), gpt2-xl (1558M).
  // Throws tandem::Error naming the presets for another name.
  // Names added by add_preset (a model read from transformers' config.json,
  // "hf:DIR") are found too once resolved (models/registry.h).
  static Gpt2Config preset(const std::string& name);
  static std::vector<std::string> preset_names();
  static void add_preset(const std::string& name, const Gpt2Config& config);
  // This config with the data's vocabulary, unless fixed_vocabulary.
  Gpt2Config with_vocabulary(int64_t vocab) const;
  // Throws tandem::Error for sizes that do not fit (heads not dividing the
  // width, non-positive sizes, dropout outside [0, 1)).
  void check() const;
};

// transformers' Conv1D: y = x W + b with W [in, out].
class Conv1DImpl : public torch::nn::Cloneable<Conv1DImpl> {
 public:
  Conv1DImpl(int64_t in, int64_t out);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return forward(x, true); }
  // Without the bias: a split region's partial sum (Note [split regions]).
  torch::Tensor forward(const torch::Tensor& x, bool with_bias);
  torch::Tensor weight, bias;

 private:
  int64_t in_, out_;  // the whole layer's (its weight may hold a part: Note [split regions])
};
TORCH_MODULE(Conv1D);

class Gpt2EmbeddingImpl : public torch::nn::Cloneable<Gpt2EmbeddingImpl>, public PositionedEmbedding {
 public:
  explicit Gpt2EmbeddingImpl(Gpt2Config config);
  void reset() override;
  // tokens [B, T] int64, T <= n_positions -> [B, T, n_embd]
  torch::Tensor forward(torch::Tensor tokens) { return forward_at(tokens, 0); }
  // At positions offset .. offset + T - 1 (models/decoding.h).
  torch::Tensor forward_at(const torch::Tensor& tokens, int64_t offset) override;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  SplitLookup split;  // wte's rows (Note [split regions])
  ContextSplit context;  // the positions held (Note [context split])

 private:
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Embedding);

class Gpt2AttentionImpl : public torch::nn::Cloneable<Gpt2AttentionImpl> {
 public:
  explicit Gpt2AttentionImpl(Gpt2Config config);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x) { return attend(x, nullptr); }
  // With a cache: over its keys and values, appending x's (models/decoding.h).
  torch::Tensor attend(const torch::Tensor& x, KvCache* cache);
  const Gpt2Config& config() const { return config_; }
  Conv1D c_attn{nullptr}, c_proj{nullptr};
  SplitRegion split;  // Note [split regions]
  ContextSplit context;  // Note [context split]

 private:
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Attention);

class Gpt2MlpImpl : public torch::nn::Cloneable<Gpt2MlpImpl> {
 public:
  explicit Gpt2MlpImpl(Gpt2Config config);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& x);
  Conv1D c_fc{nullptr}, c_proj{nullptr};
  SplitRegion split;  // Note [split regions]

 private:
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Mlp);

class Gpt2BlockImpl : public torch::nn::Cloneable<Gpt2BlockImpl>, public CachedLayer {
 public:
  explicit Gpt2BlockImpl(Gpt2Config config);
  void reset() override;
  torch::Tensor forward(torch::Tensor x) { return run(x, nullptr); }
  torch::Tensor forward_cached(const torch::Tensor& x, KvCache& cache) override { return run(x, &cache); }
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  Gpt2Attention attn{nullptr};
  Gpt2Mlp mlp{nullptr};

 private:
  torch::Tensor run(torch::Tensor x, KvCache* cache);
  Gpt2Config config_;
};
TORCH_MODULE(Gpt2Block);

class Gpt2HeadImpl : public torch::nn::Cloneable<Gpt2HeadImpl>, public TiedWeightUser {
 public:
  explicit Gpt2HeadImpl(Gpt2Config config);
  void reset() override;
  // Note [tied embedding]: the logits' weight, [vocab, n_embd].
  void tie(torch::Tensor embedding_weight) override { tied_ = std::move(embedding_weight); }
  const torch::Tensor& tied() const override { return tied_; }
  // [B, T, n_embd] -> [B, T, vocab]
  torch::Tensor forward(torch::Tensor x);
  torch::nn::LayerNorm ln_f{nullptr};
  SplitRegion split;  // enter only: the logits of this rank's vocabulary rows

 private:
  Gpt2Config config_;
  torch::Tensor tied_;
};
TORCH_MODULE(Gpt2Head);

// The model, initialised as transformers initialises GPT-2: weights
// N(0, 0.02), the residual projections' N(0, 0.02 / sqrt(2 n_layer)),
// biases 0, LayerNorms 1 and 0 (from libtorch's generator: seed it).
Sequence gpt2(const Gpt2Config& config);

// The name transformers' GPT2LMHeadModel gives a tensor of gpt2():
// embed.wte.weight -> transformer.wte.weight, h3.attn.c_attn.weight ->
// transformer.h.3.attn.c_attn.weight, head.ln_f.bias ->
// transformer.ln_f.bias. (lm_head.weight is the tied wte.)
std::string gpt2_hf_name(const std::string& name);

}  // namespace tandem::models
