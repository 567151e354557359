// The Unicode work under the tokenizers (tokenizer.h): regular expressions
// with Unicode properties (PCRE2), UTF-8 validity (PCRE2's check) and NFC
// (ICU). Nothing here is hand-written that those libraries do.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data::text {

// A pattern as `tokenizers` writes it (Oniguruma's syntax: \p{L}, (?i:..),
// (?!..) look-ahead), compiled by PCRE2 with UTF and Unicode properties
// (\s, \w by Unicode's classes), JIT-compiled where the machine allows.
class Regex {
 public:
  // Throws tandem::UsageError naming `where` for a pattern PCRE2 refuses.
  Regex(const std::string& pattern, const std::string& where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // `tokenizers`' Split with behavior "Isolated": each match a piece, and
  // each stretch between matches a piece, in order, none empty. `text`
  // must be valid UTF-8 (check_utf8).
  void split(std::string_view text, std::vector<std::string_view>& pieces) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Throws tandem::Error naming `what` and the byte offset of the first
// sequence that is not UTF-8, as PCRE2's validity check finds it.
void check_utf8(std::string_view text, const std::string& what);

// `text` in Unicode's normalization form C (ICU's); valid UTF-8 in.
std::string nfc(std::string_view text);

}  // namespace tandem::data::text
