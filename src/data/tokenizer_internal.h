// What the tokenizers of tokenizer.h share inside the data layer.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tandem/data/tokenizer.h"

namespace tandem::data::internal {

// Refuses a key of `j` (an object) that is not among `known`, naming
// `where` and the key under `prefix` ("model.").
void check_keys(const nlohmann::json& j, std::initializer_list<const char*> known, const std::string& where,
                const std::string& prefix);
// j[key] as a string, refused naming `where` and `what` when absent or not one.
std::string string_at(const nlohmann::json& j, const char* key, const std::string& where, const std::string& what);

std::unique_ptr<Tokenizer> bpe_tokenizer(const nlohmann::json& j, const std::string& path, const std::string& flag);
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& path, const std::string& flag);

}  // namespace tandem::data::internal
