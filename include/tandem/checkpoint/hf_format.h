// tandem/checkpoint/hf_format.h: the language models' weights in Hugging Face
// transformers' form, both ways.
//
//   engine::write_hf_folder("out/", model, config);       // config.json + model.safetensors
//   engine::load_hf_weights("gpt2/model.safetensors", model, config);
//
// write_hf_folder writes what AutoModelForCausalLM.from_pretrained(DIR)
// loads as it is: config.json in transformers' form (GPT2LMHeadModel,
// LlamaForCausalLM, MixtralForCausalLM or Qwen3MoeForCausalLM, the model's sizes, dropout, norms, rotary settings, the
// tie) and model.safetensors under transformers' names (the tied head left
// out, as transformers saves it; an experts' 3-D weight as one tensor per
// expert), float32 unless the model is in another dtype. load_hf_weights reads a model.safetensors (or the folder holding
// one) that transformers wrote: names with or without the "transformer." /
// "model." prefix (the Hub's original GPT-2 files have none), GPT-2's
// causal-mask buffers ("attn.bias", "attn.masked_bias") ignored, a tied
// "lm_head.weight" ignored. Strict otherwise: a tensor the model lacks or
// lacks in the file, or of another shape, is an error naming the file and
// the tensor, and nothing is copied.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/models/sequence.h"

namespace tandem::checkpoint {

// `metadata` goes into model.safetensors' header beside transformers'
// "format" (tandem's --export-weights metadata: what the model was trained
// on, so that tandem eval and tandem sample read the folder as they read
// an export).
// Weights past `max_shard_bytes` (transformers' 5 GB) go in shards under
// model.safetensors.index.json, as save_pretrained cuts them (Note
// [weight shards] in src/checkpoint/hf_shards.h).
void write_hf_folder(const std::string& dir, models::Sequence& model, const models::Gpt2Config& config,
                     const std::map<std::string, std::string>& metadata = {}, double max_shard_bytes = 5e9);
void write_hf_folder(const std::string& dir, models::Sequence& model, const models::LlamaConfig& config,
                     const std::map<std::string, std::string>& metadata = {}, double max_shard_bytes = 5e9);

void load_hf_weights(const std::string& path, models::Sequence& model, const models::Gpt2Config& config);
void load_hf_weights(const std::string& path, models::Sequence& model, const models::LlamaConfig& config);

// The same for a registry model by its preset name (gpt2-tiny ... gpt2-xl,
// llama-tiny, llama-3.2-1b, mixtral-tiny, mixtral-8x7b, qwen3-moe-tiny,
// qwen3-30b-a3b) with the data's vocabulary and the run's
// dropout (GPT-2's three pdrops) (--export-hf, --init-weights). Throws
// tandem::Error for a model without transformers' form.
bool has_hf_form(const std::string& model_name);

// The config.json (one line) transformers would read for the model of
// `model_name` as tandem builds it: for a model built from a folder's
// config.json (hf:DIR), what weights record to know it again.
std::string model_config_json(const std::string& model_name);
void write_hf_folder(const std::string& dir, models::Sequence& model, const std::string& model_name,
                     int64_t vocab_size, const std::map<std::string, std::string>& metadata = {},
                     double dropout = 0.0, double max_shard_bytes = 5e9);
void load_hf_weights(const std::string& path, models::Sequence& model, const std::string& model_name,
                     int64_t vocab_size);

// What `--weights PATH` names: a safetensors file, or a folder that
// --export-hf or save_pretrained wrote (its model.safetensors, whose
// metadata --export-hf fills as --export-weights does; a sharded folder's
// tensors, with its first shard's metadata).
SafetensorsFile read_weights_or_folder(const std::string& path);

// Reads a folder's model.safetensors.index.json, if it has one, and checks
// that each shard it names is there: a damaged index is named before any
// worker starts. Throws tandem::Error naming the file.
void check_weight_files(const std::string& path);

// Whether a safetensors file's tensor names are transformers' (a name
// under "transformer.", "model.", "lm_head.", or the Hub's unprefixed
// GPT-2 "wte."/"wpe."), not tandem's.
bool has_hf_names(const SafetensorsFile& file);

}  // namespace tandem::checkpoint
