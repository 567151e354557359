// Hugging Face's byte-level BPE from a tokenizer.json (tokenizer.h).
//
// Note [byte-level BPE]: as `tokenizers` encodes: the added tokens are
// found first (leftmost, longest), the text between them normalized (NFC
// or not at all) and cut by the pre-tokenizer's regex into pieces; each
// piece's bytes become printable characters (GPT-2's bytes_to_unicode:
// the 188 printable Latin-1 bytes stand for themselves, the others for
// U+0100 on), which start as one symbol each; the adjacent pair of lowest
// merge rank is merged, leftmost first among equals, until no pair has a
// rank. With ignore_merges (LLaMA 3) a piece that is itself in the
// vocabulary is that token. Decoding maps the characters back to bytes.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <mutex>
#include <queue>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tandem/data/tokenizer.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "text_unicode.h"
#include "tokenizer_internal.h"

namespace tandem::data {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: each byte's character, as UTF-8.
std::array<std::string, 256> byte_characters() {
  std::array<std::string, 256> out;
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next++;
    // Code points below U+0800: one or two bytes.
    out[b] = cp < 0x80 ? std::string(1, char(cp))
                       : std::string{char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  }
  return out;
}

// Note [word cache]: a piece's merges depend on the piece alone, and a
// corpus repeats its words, so each piece's ids are kept, per thread: the
// tokenize command's threads then share no lock and no cache line (one
// cache behind a shared lock took a lock and a string a piece). A thread's
// cache belongs to one tokenizer at a time (its id, never reused), dropped
// when the thread encodes with another; at most 2^20 pieces, each of at
// most 256 bytes (a long run of one piece is not met again).
struct WordCache {
  uint64_t owner = 0;
  std::unordered_map<std::string, std::vector<int32_t>> words;
};

uint64_t next_tokenizer_id() {
  static std::atomic<uint64_t> next{1};
  return next++;
}

class BpeTokenizer : public Tokenizer {
 public:
  BpeTokenizer(const json& j, const std::string& path, const std::string& flag);
  std::vector<int32_t> encode(std::string_view text, const std::string& what) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(tokens_.size()); }
  std::optional<int32_t> document_separator() const override { return separator_; }
  std::string describe() const override {
    return "byte-level BPE, " + std::to_string(tokens_.size()) + " tokens (" + path_ + ")";
  }
  const std::string& path() const override { return path_; }

 private:
  void read_model(const json& model, const std::string& where);
  void read_pre_tokenizer(const json& p, const std::string& where);
  void encode_segment(std::string_view segment, std::vector<int32_t>& out) const;
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void merge_all(std::vector<int32_t>& symbols) const;

  std::string path_;
  std::vector<std::string> tokens_;  // id -> the token's characters (or an added token's text)
  std::unordered_map<std::string, int32_t> ids_;
  std::array<int32_t, 256> byte_ids_{};
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left, right) -> (rank, merged)
  bool ignore_merges_ = false, nfc_ = false, add_prefix_space_ = false;
  std::unique_ptr<text::Regex> regex_;
  std::vector<std::pair<std::string, int32_t>> added_;  // longest first
  std::array<bool, 256> starts_added_{};  // the first bytes of the added tokens
  std::array<std::string, 256> byte_chars_ = byte_characters();
  std::unordered_map<std::string, uint8_t> char_bytes_;
  std::optional<int32_t> separator_;
  const uint64_t id_ = next_tokenizer_id();  // the owner of a thread's word cache
};

BpeTokenizer::BpeTokenizer(const json& j, const std::string& path, const std::string& flag) : path_(path) {
  const std::string where = flag + " " + path;
  internal::check_keys(j, {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
                           "post_processor", "decoder", "model"}, where, "");
  for (const char* key : {"truncation", "padding"}) {
    TANDEM_CHECK_USAGE(!j.contains(key) || j[key].is_null(), where, ": \"", key, "\" is set; tandem encodes whole "
                       "texts and takes a tokenizer without it (set it to null)");
  }
  TANDEM_CHECK_USAGE(j.contains("model") && j["model"].is_object(), where, ": no \"model\" object");
  read_model(j["model"], where);
  const json normalizer = j.value("normalizer", json());
  if (!normalizer.is_null()) {
    const auto type = internal::string_at(normalizer, "type", where, "normalizer");
    TANDEM_CHECK_USAGE(type == "NFC", where, ": normalizer.type \"", type, "\": tandem reads NFC or none");
    internal::check_keys(normalizer, {"type"}, where, "normalizer.");
    nfc_ = true;
  }
  TANDEM_CHECK_USAGE(j.contains("pre_tokenizer") && j["pre_tokenizer"].is_object(), where,
                     ": no \"pre_tokenizer\" (byte-level BPE needs the ByteLevel pre-tokenizer)");
  read_pre_tokenizer(j["pre_tokenizer"], where);
  const json decoder = j.value("decoder", json());
  TANDEM_CHECK_USAGE(decoder.is_object() && decoder.value("type", "") == "ByteLevel", where,
                     ": decoder.type must be \"ByteLevel\" (byte-level BPE), got ", decoder.dump());

  for (const auto& t : j.value("added_tokens", json::array())) {
    internal::check_keys(t, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"}, where,
                         "added_tokens[].");
    const auto content = internal::string_at(t, "content", where, "added_tokens[]");
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      TANDEM_CHECK_USAGE(!t.value(key, false), where, ": added token \"", content, "\" has ", key,
                         " set, which tandem does not match");
    }
    TANDEM_CHECK_USAGE(t.contains("id") && t["id"].is_number_unsigned(), where, ": added token \"", content,
                       "\" has no id");
    const auto id = t["id"].get<int64_t>();
    TANDEM_CHECK_USAGE(!content.empty() && id < (int64_t(1) << 31), where, ": added token \"", content,
                       "\": empty, or id ", id, " too large");
    if (id >= static_cast<int64_t>(tokens_.size())) tokens_.resize(id + 1);
    text::check_utf8(content, where + ": added token");
    TANDEM_CHECK_USAGE(tokens_[id].empty() || tokens_[id] == content, where, ": added token \"", content,
                       "\" has id ", id, ", which model.vocab gives \"", tokens_[id], "\"");
    tokens_[id] = content;
    starts_added_[static_cast<uint8_t>(content[0])] = true;
    added_.emplace_back(content, static_cast<int32_t>(id));
  }
  std::stable_sort(added_.begin(), added_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  for (size_t id = 0; id < tokens_.size(); ++id) {
    TANDEM_CHECK_USAGE(!tokens_[id].empty(), where, ": no token has id ", id, " (ids run from 0 to ",
                       tokens_.size() - 1, ")");
  }
  for (int b = 0; b < 256; ++b) char_bytes_[byte_chars_[b]] = static_cast<uint8_t>(b);
  for (const char* name : {"<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<s>", "</s>"}) {
    auto found = std::find_if(added_.begin(), added_.end(), [&](const auto& a) { return a.first == name; });
    if (found != added_.end()) {
      separator_ = found->second;
      break;
    }
  }
}

void BpeTokenizer::read_model(const json& m, const std::string& where) {
  const auto type = internal::string_at(m, "type", where, "model");
  TANDEM_CHECK_USAGE(type == "BPE", where, ": model.type \"", type, "\": tandem reads byte-level BPE "
                     "tokenizer.json files (GPT-2, LLaMA 3, Qwen) and SentencePiece .model files");
  internal::check_keys(m, {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
                           "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}, where, "model.");
  TANDEM_CHECK_USAGE(m.value("dropout", json()).is_null(), where, ": model.dropout is set (BPE dropout samples "
                     "its merges; tandem encodes deterministically)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json v = m.value(key, json());
    TANDEM_CHECK_USAGE(v.is_null() || v == "", where, ": model.", key, " is set: not a byte-level BPE");
  }
  TANDEM_CHECK_USAGE(!m.value("byte_fallback", false), where, ": model.byte_fallback is set: not a byte-level BPE");
  ignore_merges_ = m.value("ignore_merges", false);
  TANDEM_CHECK_USAGE(m.contains("vocab") && m["vocab"].is_object() && !m["vocab"].empty(), where,
                     ": model.vocab must be an object of tokens and ids");
  const auto& vocab = m["vocab"];
  TANDEM_CHECK_USAGE(vocab.size() < (size_t(1) << 31), where, ": model.vocab is too large");
  tokens_.resize(vocab.size());
  for (const auto& [token, id] : vocab.items()) {
    TANDEM_CHECK_USAGE(id.is_number_unsigned() && id.get<uint64_t>() < (uint64_t(1) << 31), where,
                       ": model.vocab[\"", token, "\"] must be an id, got ", id.dump());
    const auto i = id.get<int64_t>();
    if (i >= static_cast<int64_t>(tokens_.size())) tokens_.resize(i + 1);
    TANDEM_CHECK_USAGE(tokens_[i].empty(), where, ": model.vocab gives id ", i, " twice");
    tokens_[i] = token;
    ids_[token] = static_cast<int32_t>(i);
  }
  for (int b = 0; b < 256; ++b) {
    auto found = ids_.find(byte_chars_[b]);
    TANDEM_CHECK_USAGE(found != ids_.end(), where, ": model.vocab lacks byte ", b, "'s character \"",
                       byte_chars_[b], "\": not a byte-level vocabulary");
    byte_ids_[b] = found->second;
  }
  const json merges = m.value("merges", json::array());
  TANDEM_CHECK_USAGE(merges.is_array(), where, ": model.merges must be a list");
  int32_t rank = 0;
  for (const auto& merge : merges) {
    std::string left, right;
    if (merge.is_string()) {
      const auto s = merge.get<std::string>();
      const auto space = s.find(' ');
      TANDEM_CHECK_USAGE(space != std::string::npos && space > 0 && space + 1 < s.size() &&
                             s.find(' ', space + 1) == std::string::npos,
                         where, ": model.merges[", rank, "] \"", s, "\" is not two tokens");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else {
      TANDEM_CHECK_USAGE(merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string(),
                         where, ": model.merges[", rank, "] is not a pair of tokens: ", merge.dump());
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    }
    auto a = ids_.find(left), b = ids_.find(right), ab = ids_.find(left + right);
    TANDEM_CHECK_USAGE(a != ids_.end() && b != ids_.end() && ab != ids_.end(), where, ": model.merges[", rank,
                       "] (\"", left, "\", \"", right, "\") names a token the vocabulary lacks");
    const uint64_t key = (uint64_t(uint32_t(a->second)) << 32) | uint32_t(b->second);
    merges_.emplace(key, std::make_pair(rank, ab->second));  // the first of a repeated pair ranks
    ++rank;
  }
}

void BpeTokenizer::read_pre_tokenizer(const json& p, const std::string& where) {
  // GPT-2's pattern, which ByteLevel's use_regex applies.
  static const std::string kGpt2 =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  auto byte_level = [&](const json& b, const std::string& key, bool regex_allowed) {
    internal::check_keys(b, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where, key + ".");
    add_prefix_space_ = b.value("add_prefix_space", false);
    const bool use_regex = b.value("use_regex", true);
    TANDEM_CHECK_USAGE(regex_allowed || !use_regex, where, ": ", key, ".use_regex after a Split is not read");
    if (use_regex) regex_ = std::make_unique<text::Regex>(kGpt2, where);
  };
  const auto type = internal::string_at(p, "type", where, "pre_tokenizer");
  if (type == "ByteLevel") {
    byte_level(p, "pre_tokenizer", true);
    TANDEM_CHECK_USAGE(regex_ != nullptr, where, ": pre_tokenizer.use_regex is false: the text would not be cut");
    return;
  }
  const std::string shape = ": pre_tokenizer must be ByteLevel, or a Sequence of a Split by a regex "
                            "(behavior Isolated) and ByteLevel";
  TANDEM_CHECK_USAGE(type == "Sequence", where, ": pre_tokenizer.type \"", type, "\"", shape);
  internal::check_keys(p, {"type", "pretokenizers"}, where, "pre_tokenizer.");
  const json list = p.value("pretokenizers", json::array());
  TANDEM_CHECK_USAGE(list.is_array() && list.size() == 2, where, shape);
  const auto& split = list[0];
  TANDEM_CHECK_USAGE(split.is_object() && split.value("type", "") == "Split", where, shape);
  internal::check_keys(split, {"type", "pattern", "behavior", "invert"}, where, "pre_tokenizer.pretokenizers[0].");
  TANDEM_CHECK_USAGE(split.value("behavior", "") == "Isolated" && !split.value("invert", false), where,
                     ": pre_tokenizer.pretokenizers[0]: tandem reads behavior \"Isolated\", invert false");
  const json pattern = split.value("pattern", json());
  TANDEM_CHECK_USAGE(pattern.is_object() && pattern.size() == 1 && pattern.contains("Regex") &&
                         pattern["Regex"].is_string(),
                     where, ": pre_tokenizer.pretokenizers[0].pattern must be {\"Regex\": ...}");
  regex_ = std::make_unique<text::Regex>(pattern["Regex"].get<std::string>(), where);
  TANDEM_CHECK_USAGE(list[1].is_object() && list[1].value("type", "") == "ByteLevel", where, shape);
  auto kept = std::move(regex_);
  byte_level(list[1], "pre_tokenizer.pretokenizers[1]", false);
  regex_ = std::move(kept);
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  thread_local WordCache cache;
  if (cache.owner != id_) {
    cache.words.clear();
    cache.owner = id_;
  }
  std::string key(piece);  // short pieces stay in the string's own buffer
  if (auto found = cache.words.find(key); found != cache.words.end()) {
    out.insert(out.end(), found->second.begin(), found->second.end());
    return;
  }
  std::vector<int32_t> symbols;
  std::string chars;
  for (const char c : piece) {
    symbols.push_back(byte_ids_[static_cast<uint8_t>(c)]);
    chars += byte_chars_[static_cast<uint8_t>(c)];
  }
  auto whole = ignore_merges_ ? ids_.find(chars) : ids_.end();
  if (whole != ids_.end()) {
    symbols.assign(1, whole->second);
  } else {
    merge_all(symbols);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (piece.size() <= 256 && cache.words.size() < (size_t(1) << 20)) cache.words.emplace(std::move(key), std::move(symbols));
}

// The merges in rank order, leftmost first among equals, in O(n log n):
// the symbols a linked list, the candidate pairs a heap, a candidate
// dropped when its pair has changed since (a piece of 2 MiB of spaces
// took quadratic time with a scan per merge).
void BpeTokenizer::merge_all(std::vector<int32_t>& symbols) const {
  const auto n = static_cast<int32_t>(symbols.size());
  std::vector<int32_t> next(n);
  std::vector<int32_t> prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank, at, left, right, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : at > o.at; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int32_t at) {
    if (at < 0 || next[at] < 0) return;
    const int32_t left = symbols[at], right = symbols[next[at]];
    auto found = merges_.find((uint64_t(uint32_t(left)) << 32) | uint32_t(right));
    if (found != merges_.end()) heap.push({found->second.first, at, left, right, found->second.second});
  };
  for (int32_t i = 0; i < n; ++i) consider(i);
  while (!heap.empty()) {
    const auto c = heap.top();
    heap.pop();
    const int32_t j = next[c.at];
    if (symbols[c.at] != c.left || j < 0 || symbols[j] != c.right) continue;  // stale
    symbols[c.at] = c.merged;
    symbols[j] = -1;
    next[c.at] = next[j];
    if (next[j] >= 0) prev[next[j]] = c.at;
    consider(prev[c.at]);
    consider(c.at);
  }
  size_t kept = 0;
  for (int32_t i = 0; i >= 0 && i < n; i = next[i]) symbols[kept++] = symbols[i];
  symbols.resize(kept);
}

void BpeTokenizer::encode_segment(std::string_view segment, std::vector<int32_t>& out) const {
  std::string normalized;
  if (nfc_) {
    normalized = text::nfc(segment);
    segment = normalized;
  }
  if (add_prefix_space_ && (segment.empty() || segment.front() != ' ')) {
    normalized = " " + std::string(segment);
    segment = normalized;
  }
  thread_local std::vector<std::string_view> pieces;
  pieces.clear();
  regex_->split(segment, pieces);
  for (const auto piece : pieces) encode_piece(piece, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, const std::string& what) const {
  text::check_utf8(text, what);
  std::vector<int32_t> out;
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t id = -1;
    size_t length = 0;
    if (!starts_added_[static_cast<uint8_t>(text[i])]) {
      ++i;
      continue;
    }
    for (const auto& [content, token] : added_) {  // longest first: the first that matches
      if (text.compare(i, content.size(), content) == 0) {
        id = token;
        length = content.size();
        break;
      }
    }
    if (id < 0) {
      ++i;
      continue;
    }
    if (i > start) encode_segment(text.substr(start, i - start), out);
    out.push_back(id);
    i += length;
    start = i;
  }
  if (start < text.size()) encode_segment(text.substr(start), out);
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (const int32_t id : ids) {
    TANDEM_CHECK(id >= 0 && id < static_cast<int64_t>(tokens_.size()), "token id ", id, " is outside ", path_,
                 "'s vocabulary of ", tokens_.size());
    // As `tokenizers`' ByteLevel decoder: every token's characters, an
    // added token's too, mapped back to their bytes.
    const auto& token = tokens_[id];
    for (size_t i = 0; i < token.size();) {
      const uint8_t lead = static_cast<uint8_t>(token[i]);
      const size_t n = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
      auto found = char_bytes_.find(token.substr(i, n));
      // A character outside the byte alphabet passes as it is.
      if (found != char_bytes_.end()) {
        out.push_back(static_cast<char>(found->second));
      } else {
        out += token.substr(i, n);
      }
      i += n;
    }
  }
  return out;
}

}  // namespace

namespace internal {
std::unique_ptr<Tokenizer> bpe_tokenizer(const json& j, const std::string& path, const std::string& flag) {
  return std::make_unique<BpeTokenizer>(j, path, flag);
}
}  // namespace internal

}  // namespace tandem::data
