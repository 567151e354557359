// What a transformers config.json beside weights may say, per family
// (Note [a folder's config.json] in hf_config.cpp).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"

namespace tandem::checkpoint::internal {

enum class HfFamily { kGpt2, kLlama, kMistral, kQwen2, kQwen3, kMixtral, kQwen3Moe };

// Checks every key of `config` (read from `file`) against `model`, the
// config.json write_hf_folder writes for the model that is to load the
// weights. Throws tandem::Error naming the file, the key and its value for
// a setting that would compute something else than that model does, and
// for a key this family does not know.
// The config.json transformers writes for a model of `c` (hf_format.cpp).
nlohmann::json gpt2_json(const models::Gpt2Config& c);
nlohmann::json llama_json(const models::LlamaConfig& c);
HfFamily hf_family(const models::LlamaConfig& c);

// The rotary settings of a LLaMA-family config.json as one object
// {rope_type, rope_theta, ...}: rope_parameters, rope_scaling's keys over
// them (as transformers reads a file with both), rope_theta beside them;
// `where` the key they came from last, for messages.
nlohmann::json rope_settings(const std::string& file, const nlohmann::json& config, std::string* where);

void check_hf_config(const std::string& file, const nlohmann::json& config, const nlohmann::json& model,
                     HfFamily family);

}  // namespace tandem::checkpoint::internal
