#include "tandem/models/gpt2.h"

#include <cmath>
#include <limits>
#include <map>
#include <mutex>

#include <torch/torch.h>

#include "added_configs.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::models {

namespace {

const std::map<std::string, Gpt2Config>& presets() {
  static const std::map<std::string, Gpt2Config> all = [] {
    auto make = [](int64_t positions, int64_t width, int64_t layers, int64_t heads) {
      Gpt2Config c;
      c.n_positions = positions;
      c.n_embd = width;
      c.n_layer = layers;
      c.n_head = heads;
      return c;
    };
    return std::map<std::string, Gpt2Config>{
        {"gpt2-tiny", make(256, 128, 4, 4)},      {"gpt2", make(1024, 768, 12, 12)},
        {"gpt2-medium", make(1024, 1024, 24, 16)}, {"gpt2-large", make(1024, 1280, 36, 20)},
        {"gpt2-xl", make(1024, 1600, 48, 25)},
        // GPT-3 175B (Brown et al. 2020; Megatron-LM's 2021 runs): GPT-2's
        // architecture at 96 layers of width 12,288, 96 heads, 2,048 positions.
        {"gpt3-175b", make(2048, 12288, 96, 96)},
    };
  }();
  return all;
}

void init_normal(torch::Tensor& t, double std) {
  torch::NoGradGuard no_grad;
  t.normal_(0.0, std);
}

torch::nn::LayerNorm layer_norm(const Gpt2Config& c) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd}).eps(c.layer_norm_eps));
}

}  // namespace

using AddedGpt2 = internal::AddedConfigs<Gpt2Config>;

Gpt2Config Gpt2Config::preset(const std::string& name) {
  auto it = presets().find(name);
  if (it != presets().end()) return it->second;
  Gpt2Config found;
  // Note [model resolvers] (models/registry.h): "hf:DIR" and the like.
  if (AddedGpt2::instance().find(name, &found)) return found;
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  TANDEM_CHECK_USAGE(false, "unknown GPT-2 size '", name, "' (known: ", known, ")");
  return {};
}

std::vector<std::string> Gpt2Config::preset_names() {
  std::vector<std::string> names = {"gpt2-tiny", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b"};
  AddedGpt2::instance().append_names(names);
  return names;
}

void Gpt2Config::add_preset(const std::string& name, const Gpt2Config& config) {
  config.check();
  TANDEM_CHECK(presets().count(name) == 0, "GPT-2: '", name, "' is a preset's name");
  AddedGpt2::instance().add(name, config, "GPT-2");
}

Gpt2Config Gpt2Config::with_vocabulary(int64_t vocab) const {
  Gpt2Config c = *this;
  if (!fixed_vocabulary) c.vocab_size = vocab;
  return c;
}

void Gpt2Config::check() const {
  TANDEM_CHECK(vocab_size > 0 && n_positions > 0 && n_embd > 0 && n_layer > 0 && n_head > 0,
               "GPT-2: sizes must be positive (vocabulary ", vocab_size, ", positions ", n_positions, ", width ",
               n_embd, ", layers ", n_layer, ", heads ", n_head, ")");
  TANDEM_CHECK(n_embd % n_head == 0, "GPT-2: ", n_head, " heads do not divide the width ", n_embd);
  TANDEM_CHECK(dropout >= 0 && dropout < 1, "GPT-2: dropout must be in [0, 1), got ", dropout);
}

Conv1DImpl::Conv1DImpl(int64_t in, int64_t out) : in_(in), out_(out) { reset(); }

void Conv1DImpl::reset() {
  weight = register_parameter("weight", torch::empty({in_, out_}));
  bias = register_parameter("bias", torch::zeros({out_}));
  init_normal(weight, 0.02);
}

// Note [Conv1D on the CPU]: transformers keeps GPT-2's weights as [in,
// out] and multiplies x W. On the CPU libtorch's GEMMs run that layout
// about 3% slower, forward and backward, than Linear's x W^T over an [out,
// in] weight (4096 x 128 by 128 x 384, 2 threads). The weight is small
// beside the activations, so it is copied into Linear's layout each step
// (its gradient copied back by autograd) and multiplied as Linear does;
// the parameter keeps transformers' layout and name. On CUDA the two
// layouts run alike, and the copy would be one more kernel.
torch::Tensor Conv1DImpl::forward(const torch::Tensor& x, bool with_bias) {
  if (!x.is_cuda()) return torch::linear(x, weight.t().contiguous(), with_bias ? bias : torch::Tensor());
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(1);
  auto flat = x.reshape({-1, weight.size(0)});
  return (with_bias ? torch::addmm(bias, flat, weight) : torch::mm(flat, weight)).view(sizes);
}

Gpt2EmbeddingImpl::Gpt2EmbeddingImpl(Gpt2Config config) : config_(config) { reset(); }

void Gpt2EmbeddingImpl::reset() {
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config_.n_positions, config_.n_embd));
  init_normal(wte->weight, 0.02);
  init_normal(wpe->weight, 0.02);
}

torch::Tensor Gpt2EmbeddingImpl::forward_at(const torch::Tensor& tokens, int64_t offset) {
  TANDEM_CHECK(tokens.dim() == 2, "GPT-2: expected tokens [batch, sequence], got ", tokens.sizes());
  const int64_t t = tokens.size(1);
  TANDEM_CHECK(offset + t * context.parts <= config_.n_positions, "GPT-2: a sequence of ", offset + t * context.parts,
               " tokens is longer than the model's ", config_.n_positions, " positions");
  TANDEM_CHECK(offset == 0 || !context.positions, "GPT-2: decoding after a cache under context parallelism");
  auto positions = context.positions ? context.positions(t, tokens.device())
                                     : torch::arange(offset, offset + t,
                                                     torch::TensorOptions().dtype(torch::kInt64).device(tokens.device()));
  auto x = split.lookup(wte->weight, tokens) + wpe->forward(split.positions(positions));
  return split.dropout(x, config_.dropout, is_training(), t);
}

Gpt2AttentionImpl::Gpt2AttentionImpl(Gpt2Config config) : config_(config) { reset(); }

void Gpt2AttentionImpl::reset() {
  c_attn = register_module("c_attn", Conv1D(config_.n_embd, 3 * config_.n_embd));
  c_proj = register_module("c_proj", Conv1D(config_.n_embd, config_.n_embd));
  init_normal(c_proj->weight, 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer)));
}

torch::Tensor Gpt2AttentionImpl::attend(const torch::Tensor& x, KvCache* cache) {
  // The heads from the widths: a split region holds some of them.
  // Under sequence parallelism `x` holds part of the sequence, `in` all of it.
  const auto in = split.in(x);
  const int64_t b = in.size(0), t = in.size(1), d = config_.n_embd / config_.n_head;
  auto qkv = c_attn->forward(in).chunk(3, /*dim=*/2);
  const int64_t h = qkv[0].size(2) / d;  // (not -1: a batch may be empty)
  auto heads = [&](const torch::Tensor& y) { return y.view({b, t, h, d}).transpose(1, 2); };
  const double p = is_training() ? config_.dropout : 0.0;
  torch::Tensor y;
  TANDEM_CHECK(!context.split() || (cache == nullptr && p == 0),
               "GPT-2: context parallelism with attention dropout or a cache is not supported");
  if (context.split()) {
    y = context.attend(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]));
  } else if (cache == nullptr && p > 0) {
    // The mask of the probabilities of every head, drawn whole, this
    // rank's heads' part kept (Note [dropout under tp]); sdpa would draw
    // the heads' part alone. The causal softmax as sdpa's math path.
    auto q = heads(qkv[0]), k = heads(qkv[1]), v = heads(qkv[2]);
    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
    auto later = torch::ones({t, t}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    auto probs = torch::softmax(scores.masked_fill(later, -std::numeric_limits<double>::infinity()), -1);
    y = torch::matmul(split.dropout_heads(probs, p, true, config_.n_head), v);
  } else if (cache == nullptr) {
    y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]), /*attn_mask=*/{}, p,
                                         /*is_causal=*/true);
  } else {
    auto [k, v] = cache->append(heads(qkv[1]), heads(qkv[2]));
    y = cached_attention(heads(qkv[0]), k, v, p);
  }
  y = y.transpose(1, 2).contiguous().view({b, t, h * d});
  auto out = split.split() ? split.out(c_proj->forward(y, false)) + c_proj->bias : c_proj->forward(y);
  return split.dropout_out(out, config_.dropout, is_training(), t);
}

Gpt2MlpImpl::Gpt2MlpImpl(Gpt2Config config) : config_(config) { reset(); }

void Gpt2MlpImpl::reset() {
  c_fc = register_module("c_fc", Conv1D(config_.n_embd, 4 * config_.n_embd));
  c_proj = register_module("c_proj", Conv1D(4 * config_.n_embd, config_.n_embd));
  init_normal(c_proj->weight, 0.02 / std::sqrt(2.0 * static_cast<double>(config_.n_layer)));
}

torch::Tensor Gpt2MlpImpl::forward(const torch::Tensor& x) {
  const auto in = split.in(x);  // under sequence parallelism the whole sequence, `x` a part
  auto hidden = torch::gelu(c_fc->forward(in), "tanh");
  auto y = split.split() ? split.out(c_proj->forward(hidden, false)) + c_proj->bias : c_proj->forward(hidden);
  return split.dropout_out(y, config_.dropout, is_training(), in.size(1));
}

Gpt2BlockImpl::Gpt2BlockImpl(Gpt2Config config) : config_(config) { reset(); }

void Gpt2BlockImpl::reset() {
  ln_1 = register_module("ln_1", layer_norm(config_));
  attn = register_module("attn", Gpt2Attention(config_));
  ln_2 = register_module("ln_2", layer_norm(config_));
  mlp = register_module("mlp", Gpt2Mlp(config_));
}

torch::Tensor Gpt2BlockImpl::run(torch::Tensor x, KvCache* cache) {
  x = x + attn->attend(ln_1->forward(x), cache);
  return x + mlp->forward(ln_2->forward(x));
}

Gpt2HeadImpl::Gpt2HeadImpl(Gpt2Config config) : config_(config) { reset(); }

void Gpt2HeadImpl::reset() { ln_f = register_module("ln_f", layer_norm(config_)); }

torch::Tensor Gpt2HeadImpl::forward(torch::Tensor x) {
  TANDEM_CHECK(tied_.defined(), "GPT-2: the head is not bound to a token embedding (Gpt2HeadImpl::tie)");
  return torch::linear(split.in(ln_f->forward(x)), tied_);
}

Sequence gpt2(const Gpt2Config& config) {
  config.check();
  Sequence model;
  Gpt2Embedding embed(config);
  model->push_back("embed", embed);
  for (int64_t i = 0; i < config.n_layer; ++i) model->push_back("h" + std::to_string(i), Gpt2Block(config));
  model->push_back("head", Gpt2Head(config));
  model->tie(model->size() - 1, "embed.wte.weight");  // Note [tied embedding]
  return model;
}

std::string gpt2_hf_name(const std::string& name) {
  if (name.rfind("embed.", 0) == 0) return "transformer." + name.substr(6);
  if (name.rfind("head.", 0) == 0) return "transformer." + name.substr(5);
  if (name.size() > 1 && name[0] == 'h') {
    const auto dot = name.find('.');
    if (dot != std::string::npos && dot > 1 &&
        name.find_first_not_of("0123456789", 1) == dot) {
      return "transformer.h." + name.substr(1, dot - 1) + name.substr(dot);
    }
  }
  TANDEM_CHECK(false, "GPT-2: '", name, "' is not a tensor of the model");
  return {};
}

}  // namespace tandem::models
