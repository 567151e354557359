// tandem/plan/model_shape.h: a registry language model as the planner sees
// it: its parameters layer by layer, the tensors they are, the FLOPs of a
// token and the activations a layer keeps for backward, from its preset's
// shape without building it.
#pragma once

#include <cstdint>
#include <numeric>
#include <optional>
#include <string>

#include "tandem/plan/image_shape.h"

namespace tandem::plan {

struct ModelShape {
  std::string name;
  bool llama = false;  // LLaMA's decoder (RMSNorm, SwiGLU, rotary, GQA); else GPT-2's
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, context = 0;
  int64_t experts = 0, experts_per_token = 0, expert_ffn = 0;
  bool tied = false;
  // Parameters: one decoder layer's (all layers alike), the embedding's
  // (tokens, and GPT-2's learned positions), the final norm's, the head's
  // (0 when tied to the embedding). Tensors likewise (DDP sends a used
  // flag per tensor).
  int64_t layer_parameters = 0, embedding_parameters = 0, norm_parameters = 0, head_parameters = 0;
  int64_t layer_tensors = 0, embedding_tensors = 0, norm_tensors = 0, head_tensors = 0;
  // Of a layer's parameters, those tensor parallelism cuts (the rest, its
  // norms and GPT-2's output biases, stay whole on every tp rank).
  int64_t layer_cut_parameters = 0;
  // Of the whole ones, those whose gradients are partial sums over tp (a
  // router's, Qwen3's q/k norms'): all-reduced over tp without sequence
  // parallelism too.
  int64_t layer_partial_parameters = 0;
  // An image classifier's measured shape (image_shape.h): set for image
  // models only, whose layouts image_cost plans; the fields above are then
  // unused but `name` and `layers` (its layers as FSDP sees them).
  std::optional<ImageShape> image;
  int64_t parameters() const {
    if (image) return std::accumulate(image->layer_numels.begin(), image->layer_numels.end(), int64_t(0));
    return layers * layer_parameters + embedding_parameters + norm_parameters + head_parameters;
  }
  // Forward and backward FLOPs of one token at `seq_len` (the registry's:
  // 6 per multiplying weight plus attention's 12 L d T).
  double flops_per_token(int64_t seq_len) const;
  // Elements one layer keeps for backward per token, without tensor
  // parallelism: `norms` those of its two norms (their inputs, and
  // RMSNorm's normalised input), which sequence parallelism cuts;
  // `region_inputs` the norms' outputs the tp regions read, kept whole
  // (all-gathered under sequence parallelism); `inside` those tp divides
  // (q, k, v, attention's output, the MLP's), attention's scores not kept
  // (a fused kernel's log-sum-exp only).
  double activations_norms_per_token() const;
  double activations_region_inputs_per_token() const { return 2.0 * double(hidden); }
  double activations_inside_per_token() const;
};

// The preset `model` ("gpt2-tiny", "llama-3-8b", ...) with the vocabulary
// `vocab` (0: the preset's own). Throws tandem::UsageError naming --model
// for a model that is not a registry language model.
ModelShape model_shape(const std::string& model, int64_t vocab = 0);

// The registry's image classifiers, ", "-separated; whether `model` is one.
std::string image_models();
bool is_image_model(const std::string& model);

// The image classifier `model` for images of `channels` x `image_size` x
// `image_size` in `classes` classes, measured (measure_image_model).
ModelShape image_model_shape(const std::string& model, int64_t channels, int64_t image_size, int64_t classes,
                             bool float64);

}  // namespace tandem::plan
