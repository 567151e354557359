#include "tandem/util/env.h"

#include <unistd.h>

#include <cstdlib>

#include "tandem/util/check.h"
#include "tandem/util/parse.h"

namespace tandem::env {

std::optional<std::string> get(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::optional<long long> get_int(const std::string& name) {
  auto value = get(name);
  if (!value) return std::nullopt;
  auto parsed = parse_int(*value);
  TANDEM_CHECK(parsed, "environment variable ", name, ": expected an integer, got '", *value, "'");
  return parsed;
}

std::vector<std::string> snapshot() {
  std::vector<std::string> out;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) out.emplace_back(*entry);
  return out;
}

}  // namespace tandem::env
