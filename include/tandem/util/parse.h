// tandem/util/parse.h: strict conversions from text (whole string or nothing).
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tandem {

// Decimal only: a sign is "-" alone, and nothing before or after the
// number (the C library's strtoll and strtod would also take " 42", "+42"
// and "0x10").

// "42", "-7" -> value; "", "4x", "1e3", " 42", "+42", "0x10", out of range -> nullopt.
std::optional<long long> parse_int(const std::string& text);

// "42", "18446744073709551615" -> value; "-1", "", "4x", "+42", out of range -> nullopt.
std::optional<unsigned long long> parse_uint(const std::string& text);

// "0.1", "1e-3", "5", "-2" -> value; "", "abc", "nan", "inf", " 1", "+1", "0x10" -> nullopt.
std::optional<double> parse_double(const std::string& text);

// Whether `text` is written as a decimal number, whatever its size: true
// for 1e309 and 1e-400, which parse_double refuses as out of range; false
// for inf, nan and the forms parse_double never takes.
bool looks_like_number(const std::string& text);

// "a,b,,c" -> {"a", "b", "", "c"}.
std::vector<std::string> split(const std::string& text, char sep);

}  // namespace tandem
