// tandem/util/env.h: the only place that reads environment variables.
//
// Every variable tandem looks at is read through these functions, so the full
// list is `grep -r "env::" src/`.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem::env {

// The variable's value, or nullopt when it is unset.
std::optional<std::string> get(const std::string& name);

// The variable parsed as an integer; nullopt when unset; throws tandem::Error
// naming the variable when it is set but not an integer.
std::optional<long long> get_int(const std::string& name);

// The whole environment as NAME=VALUE strings (for starting child processes).
std::vector<std::string> snapshot();

}  // namespace tandem::env
