// The language models of the registry (models/registry.h): each preset of
// gpt2() and llama() as a factory of ModelOptions, with its traits.
#pragma once

#include <map>
#include <string>
#include <utility>

#include "tandem/models/registry.h"

namespace tandem::models {

// "gpt2-tiny" ... "gpt2-xl", "llama-tiny", "llama-3.2-1b".
std::map<std::string, std::pair<ModelFactory, ModelTraits>> language_models();

}  // namespace tandem::models
