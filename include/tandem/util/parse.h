// tandem/util/parse.h: strict conversions from text (whole string or nothing).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem {

// "42" -> 42; "", "4x", "1e3", out of range -> nullopt.
std::optional<long long> parse_int(const std::string& text);

// "0.1", "1e-3", "5" -> value; "", "abc", "nan", "inf" -> nullopt.
std::optional<double> parse_double(const std::string& text);

// "a,b,,c" -> {"a", "b", "", "c"}.
std::vector<std::string> split(const std::string& text, char sep);

}  // namespace tandem
