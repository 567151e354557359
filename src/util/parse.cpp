#include "tandem/util/parse.h"

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace tandem {

namespace {
// The forms the C library takes beyond plain decimal: leading space, "+",
// hexadecimal ("0x10", "0x1p3").
bool plain_decimal(const std::string& text) {
  if (text.empty() || text[0] == '+' || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  return text.find_first_of("xX") == std::string::npos;
}
}  // namespace

std::optional<long long> parse_int(const std::string& text) {
  if (!plain_decimal(text)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

std::optional<unsigned long long> parse_uint(const std::string& text) {
  if (!plain_decimal(text) || text[0] == '-') return std::nullopt;
  errno = 0;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_double(const std::string& text) {
  if (!plain_decimal(text)) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

bool looks_like_number(const std::string& text) {
  if (!plain_decimal(text) || text.find_first_of("iInN") != std::string::npos) return false;
  char* end = nullptr;
  std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size();
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> parts;
  std::string::size_type start = 0;
  while (true) {
    auto pos = text.find(sep, start);
    parts.push_back(text.substr(start, pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

}  // namespace tandem
