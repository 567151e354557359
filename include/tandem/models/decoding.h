// tandem/models/decoding.h: generation from a language model with a
// key/value cache (`tandem sample`).
//
//   auto tokens = models::generate(model, prompt, {.max_tokens = 100, .temperature = 0.8, .top_k = 40});
//
// Note [key/value cache]: a causal layer's keys and values for the tokens
// so far never change, so each layer keeps them and a new token costs one
// position's projections and one row of attention instead of the whole
// sequence again. The parts of a language model's Sequence say how: the
// first child places the new tokens at their positions
// (PositionedEmbedding), each middle child attends over its cache and
// appends to it (CachedLayer), the last maps to logits as in training.
// The prompt goes through in one pass (a causal mask over it), each new
// token alone (no mask: it sees everything before it); the logits equal
// those of the whole sequence recomputed (tests/models/decoding_test.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include <torch/torch.h>

#include "tandem/models/sequence.h"

namespace tandem::models {

// One layer's keys and values so far, [B, heads, T_past, head size].
struct KvCache {
  torch::Tensor keys, values;
  int64_t length() const { return keys.defined() ? keys.size(2) : 0; }
  // Appends `k` and `v` ([B, heads, T_new, D]) and returns the whole keys
  // and values.
  std::pair<torch::Tensor, torch::Tensor> append(const torch::Tensor& k, const torch::Tensor& v);
};

// The attention of `q` ([B, H, T_new, D]) over `k`, `v` ([B, H, T_past +
// T_new, D]), each new query seeing the keys up to its own position:
// is_causal over a first pass, no mask for one new token, an explicit mask
// for several after a cache. `scale` 0: 1/sqrt(D).
torch::Tensor cached_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout, double scale = 0);

// A language model's first child: tokens [B, T] placed at positions
// offset .. offset + T - 1.
class PositionedEmbedding {
 public:
  virtual ~PositionedEmbedding() = default;
  virtual torch::Tensor forward_at(const torch::Tensor& tokens, int64_t offset) = 0;
};

// A decoder layer: `x` [B, T_new, C] after the cache's positions.
class CachedLayer {
 public:
  virtual ~CachedLayer() = default;
  virtual torch::Tensor forward_cached(const torch::Tensor& x, KvCache& cache) = 0;
};

struct SampleOptions {
  int64_t max_tokens = 100;  // tokens generated after the prompt
  double temperature = 1.0;  // 0: greedy (the most likely token)
  int64_t top_k = 0;         // sample among the k most likely only (0: all)
  uint64_t seed = 0;         // the sampling generator's seed
  int64_t context = 0;       // the longest sequence the model takes (its positions); 0: no limit
  // Called with each step's tokens ([B, 1], on the model's device) as they
  // are drawn, so that a caller can print them as they come.
  std::function<void(const torch::Tensor&)> on_token;
};

// Whether `model` is a Sequence of the parts above (gpt2(), llama()).
bool decodes_with_cache(Sequence& model);

// The `max_tokens` tokens that follow `prompt` ([B, T] int64, on the
// model's device), [B, max_tokens], in eval mode without gradients. A
// sequence that would pass `context` keeps its last `context` tokens, the
// cache recomputed over them (as nanoGPT crops). Throws tandem::Error when
// the model does not decode with a cache, or the options are out of range.
torch::Tensor generate(Sequence& model, const torch::Tensor& prompt, const SampleOptions& options);

}  // namespace tandem::models
