// PCRE2 and ICU under the tokenizers (text_unicode.h).
#include "text_unicode.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include "tandem/util/check.h"

namespace tandem::data::text {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  const int n = pcre2_get_error_message(code, buffer, sizeof(buffer));
  return n > 0 ? std::string(reinterpret_cast<const char*>(buffer), n) : "error " + std::to_string(code);
}

pcre2_code* compile_pattern(const std::string& pattern, uint32_t options, const std::string& where) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   PCRE2_UTF | PCRE2_UCP | options, &error, &offset, nullptr);
  TANDEM_CHECK_USAGE(code != nullptr, where, ": the regular expression ", pattern, " does not compile (",
                     pcre2_message(error), " at offset ", offset, ")");
  return code;
}

// Match data for one thread's calls (a pattern's ovector of one pair).
struct MatchData {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  ~MatchData() { pcre2_match_data_free(data); }
};

pcre2_match_data* thread_match_data() {
  thread_local MatchData md;
  return md.data;
}

}  // namespace

struct Regex::Impl {
  pcre2_code* code = nullptr;
  ~Impl() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(std::make_unique<Impl>()) {
  impl_->code = compile_pattern(pattern, 0, where);
  pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE);  // the interpreter where JIT is unavailable
}

Regex::~Regex() = default;

void Regex::split(std::string_view text, std::vector<std::string_view>& pieces) const {
  auto* md = thread_match_data();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0, last = 0;
  while (start <= text.size()) {
    const int rc = pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    TANDEM_CHECK(rc >= 0, "the tokenizer's regular expression failed: ", pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (begin > last) pieces.push_back(text.substr(last, begin - last));
    if (end > begin) {
      pieces.push_back(text.substr(begin, end - begin));
      last = start = end;
    } else {
      // An empty match: the next search starts a character later.
      start = end + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) ++start;
      last = begin;
    }
  }
  if (last < text.size()) pieces.push_back(text.substr(last));
}

void check_utf8(std::string_view text, const std::string& what) {
  // An empty pattern matches at once; PCRE2 checks the whole subject first.
  static pcre2_code* const empty = compile_pattern("", 0, "the UTF-8 check");
  auto* md = thread_match_data();
  const int rc = pcre2_match(empty, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0, 0, md, nullptr);
  if (rc >= 0 || rc == PCRE2_ERROR_NOMATCH) return;
  const bool utf = rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21;
  TANDEM_CHECK(!utf, what, " is not UTF-8: byte offset ", pcre2_get_startchar(md), " (", pcre2_message(rc), ")");
  TANDEM_CHECK(false, what, ": the UTF-8 check failed: ", pcre2_message(rc));
}

std::string nfc(std::string_view text) {
  UErrorCode status = U_ZERO_ERROR;
  const auto* normalizer = icu::Normalizer2::getNFCInstance(status);
  TANDEM_CHECK(U_SUCCESS(status), "ICU's NFC normalizer is unavailable: ", u_errorName(status));
  const auto in = icu::UnicodeString::fromUTF8(icu::StringPiece(text.data(), static_cast<int32_t>(text.size())));
  if (normalizer->isNormalized(in, status) && U_SUCCESS(status)) return std::string(text);
  status = U_ZERO_ERROR;
  const auto out = normalizer->normalize(in, status);
  TANDEM_CHECK(U_SUCCESS(status), "NFC normalization failed: ", u_errorName(status));
  std::string bytes;
  out.toUTF8String(bytes);
  return bytes;
}

}  // namespace tandem::data::text
