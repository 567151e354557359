// tandem/checkpoint/hf_model.h: models built from a transformers
// config.json: `--model hf:DIR`.
//
//   checkpoint::enable_hf_models();  // once, before flags name models
//   auto model = models::make_model("hf:/path/to/Qwen3-0.6B", options);
//
// DIR/config.json's model_type picks the family: gpt2 (GPT2LMHeadModel),
// llama (LlamaForCausalLM: LLaMA 2 and 3, rotary scaling "llama3",
// attention_bias, mlp_bias), mistral (MistralForCausalLM, its attention
// window), qwen2 (Qwen2ForCausalLM: q/k/v biases), qwen3
// (Qwen3ForCausalLM: q/k norms, a head size of its own), mixtral and
// qwen3_moe (the experts of models/moe.h). Each key is read as transformers
// reads it, its default where the file leaves it out, and the file is then
// checked whole as a folder's config.json beside weights is (Note [a
// folder's config.json] in src/checkpoint/hf_config.cpp): a key tandem does
// not know, or a setting it does not compute (another activation, a
// rotary type, windowed layers), is refused naming the file and the key.
// The model's vocabulary is the config's; the data's must fit in it.
// Weights come from --init-weights (the folder itself, one file or shards).
#pragma once

#include <string>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"

namespace tandem::checkpoint {

// Registers the resolver of "hf:" model names (Note [model resolvers] in
// models/registry.h). Errors in the folder's config.json are usage errors
// naming the file and key. Idempotent.
void enable_hf_models();

// The family and shape DIR/config.json describes: exactly one of the two
// is set. Throws tandem::Error naming the file and key.
struct HfModelConfig {
  bool gpt2 = false;
  models::Gpt2Config gpt2_config;
  models::LlamaConfig llama_config;
};
HfModelConfig read_hf_model_config(const std::string& dir);

}  // namespace tandem::checkpoint
