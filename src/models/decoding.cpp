// Generation with a key/value cache (decoding.h).
#include "tandem/models/decoding.h"

#include <cmath>
#include <limits>

#include <ATen/CPUGeneratorImpl.h>

#include "tandem/util/check.h"

namespace tandem::models {

std::pair<torch::Tensor, torch::Tensor> KvCache::append(const torch::Tensor& k, const torch::Tensor& v) {
  keys = keys.defined() ? torch::cat({keys, k}, 2) : k;
  values = values.defined() ? torch::cat({values, v}, 2) : v;
  return {keys, values};
}

torch::Tensor cached_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout, double scale) {
  const int64_t t_new = q.size(2), t_all = k.size(2);
  std::optional<double> s;
  if (scale > 0) s = scale;
  if (t_new == t_all) return at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true, s);
  if (t_new == 1) return at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/false, s);
  // Query i is position t_all - t_new + i: it sees keys 0 .. that position.
  auto rows = torch::arange(t_all - t_new, t_all, torch::TensorOptions().dtype(torch::kInt64).device(q.device()));
  auto cols = torch::arange(t_all, torch::TensorOptions().dtype(torch::kInt64).device(q.device()));
  auto mask = cols.unsqueeze(0) <= rows.unsqueeze(1);  // [T_new, T_all], true: attend
  return at::scaled_dot_product_attention(q, k, v, mask, dropout, /*is_causal=*/false, s);
}

namespace {

struct Parts {
  PositionedEmbedding* embed = nullptr;
  std::vector<CachedLayer*> layers;
};

Parts parts_of(Sequence& model) {
  Parts parts;
  if (model->size() < 3) return parts;  // an embedding, at least one layer, a head
  parts.embed = dynamic_cast<PositionedEmbedding*>(model->at(0).ptr().get());
  for (size_t i = 1; i + 1 < model->size(); ++i) {
    auto* layer = dynamic_cast<CachedLayer*>(model->at(i).ptr().get());
    if (layer == nullptr) return {};
    parts.layers.push_back(layer);
  }
  return parts;
}

// Logits of the last position of `tokens` after the caches' positions.
torch::Tensor step(Sequence& model, Parts& parts, std::vector<KvCache>& caches, const torch::Tensor& tokens) {
  auto x = parts.embed->forward_at(tokens, caches.front().length());
  for (size_t i = 0; i < parts.layers.size(); ++i) x = parts.layers[i]->forward_cached(x, caches[i]);
  x = x.narrow(1, x.size(1) - 1, 1);  // the head maps only the last position
  return model->at(model->size() - 1).forward(x).select(1, 0);  // [B, vocab]
}

}  // namespace

bool decodes_with_cache(Sequence& model) { return parts_of(model).embed != nullptr; }

torch::Tensor generate(Sequence& model, const torch::Tensor& prompt, const SampleOptions& o) {
  auto parts = parts_of(model);
  TANDEM_CHECK(parts.embed != nullptr, "generation needs a language model whose layers keep a key/value cache "
               "(gpt2, llama)");
  TANDEM_CHECK(prompt.dim() == 2 && prompt.size(1) > 0 && prompt.scalar_type() == torch::kInt64,
               "generation: expected a prompt of token ids [batch, tokens] (int64), got ", prompt.sizes(), " ",
               prompt.scalar_type());
  TANDEM_CHECK(o.max_tokens >= 0, "generation: max_tokens must be >= 0, got ", o.max_tokens);
  TANDEM_CHECK(o.temperature >= 0 && std::isfinite(o.temperature), "generation: temperature must be >= 0, got ",
               o.temperature);
  TANDEM_CHECK(o.top_k >= 0, "generation: top_k must be >= 0, got ", o.top_k);
  TANDEM_CHECK(o.context >= 0, "generation: context must be >= 0, got ", o.context);
  torch::NoGradGuard no_grad;
  // Eval mode for the generation, the caller's mode back however it ends.
  struct Mode {
    Sequence& model;
    bool training;
    ~Mode() { model->train(training); }
  } mode{model, model->is_training()};
  model->eval();
  auto generator = at::make_generator<at::CPUGeneratorImpl>(o.seed);
  auto sequence = prompt;
  if (o.context > 0 && sequence.size(1) > o.context) sequence = sequence.narrow(1, sequence.size(1) - o.context, o.context);
  std::vector<KvCache> caches(parts.layers.size());
  auto logits = step(model, parts, caches, sequence);
  // One tensor for the whole result, filled a column a step.
  auto out = torch::empty({prompt.size(0), o.max_tokens}, prompt.options().device(logits.device()));
  for (int64_t n = 0; n < o.max_tokens; ++n) {
    torch::Tensor next;
    if (o.temperature == 0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      auto scaled = logits.to(torch::kFloat64) / o.temperature;
      if (o.top_k > 0 && o.top_k < scaled.size(-1)) {
        auto kth = std::get<0>(scaled.topk(o.top_k, -1)).narrow(-1, o.top_k - 1, 1);
        scaled = scaled.masked_fill(scaled < kth, -std::numeric_limits<double>::infinity());
      }
      // Drawn on the CPU from the seeded generator: the same tokens on any device.
      next = torch::multinomial(torch::softmax(scaled, -1).cpu(), 1, false, generator).to(logits.device());
    }
    out.narrow(1, n, 1).copy_(next);
    if (o.on_token) o.on_token(next);
    sequence = torch::cat({sequence, next}, 1);
    if (n + 1 == o.max_tokens) break;
    if (o.context > 0 && sequence.size(1) > o.context) {
      // Past the positions: recompute over the last `context` tokens.
      sequence = sequence.narrow(1, sequence.size(1) - o.context, o.context);
      caches.assign(parts.layers.size(), KvCache{});
      logits = step(model, parts, caches, sequence);
    } else {
      logits = step(model, parts, caches, next);
    }
  }
  return out;
}

}  // namespace tandem::models
