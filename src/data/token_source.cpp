// open_tokens: the files a text: or tokens: spec names, and its two splits.
#include <glob.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "tandem/data/tokenizer.h"
#include "tandem/data/tokens.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::data {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    parts.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// The regular files directly in `dir` (not hidden), in name order; with
// `extension`, only those ending in it.
std::vector<std::string> folder_files(const std::string& spec, const std::string& dir, const std::string& extension) {
  std::vector<std::string> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (!extension.empty() && (name.size() < extension.size() ||
                               name.compare(name.size() - extension.size(), extension.size(), extension) != 0)) {
      continue;
    }
    if (fs::is_regular_file(it->path(), ec)) files.push_back(it->path().string());
  }
  TANDEM_CHECK(!ec, spec, ": cannot list ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  TANDEM_CHECK(!files.empty(), spec, ": ", dir, " holds no ", extension.empty() ? "file" : extension + " file");
  return files;
}

// text:FILE, text:A,B or text:DIR.
std::vector<std::string> text_files(const std::string& spec, const std::string& path) {
  std::vector<std::string> files;
  for (const auto& part : split_commas(path)) {
    TANDEM_CHECK_USAGE(!part.empty(), "data spec '", spec, "': an empty file name between commas");
    std::error_code ec;
    if (fs::is_directory(part, ec)) {
      for (auto& f : folder_files(spec, part, "")) files.push_back(std::move(f));
    } else {
      check_regular_file(part, "a text file or a folder of them");
      files.push_back(part);
    }
  }
  return files;
}

// tokens:FILE, tokens:DIR (its .bin files) or tokens:GLOB.
std::vector<std::string> token_files(const std::string& spec, const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return folder_files(spec, path, ".bin");
  if (path.find_first_of("*?[") == std::string::npos) {
    check_regular_file(path, "a token file, a folder of .bin files or a glob");
    return {path};
  }
  glob_t g{};
  const int rc = ::glob(path.c_str(), GLOB_ERR, nullptr, &g);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  TANDEM_CHECK(rc == 0 || rc == GLOB_NOMATCH, spec, ": cannot expand the pattern (glob error ", rc, ")");
  TANDEM_CHECK(!files.empty(), spec, ": no file matches ", path);
  std::sort(files.begin(), files.end());
  return files;
}

// llm.c names its validation shards *_val_*; nanoGPT writes val.bin.
bool validation_file(const std::string& path) {
  const std::string name = fs::path(path).filename().string();
  return name.find("_val_") != std::string::npos || name == "val.bin";
}

// The tokenizer at `path`, read once for both splits (train and val):
// the last one read is kept while its file's size and time stay the same
// (a large tokenizer.json takes a second to parse).
std::shared_ptr<const Tokenizer> shared_tokenizer(const std::string& path) {
  static std::mutex mutex;
  static std::string kept_path;
  static std::pair<std::uintmax_t, fs::file_time_type> kept_stamp;
  static std::shared_ptr<const Tokenizer> kept;
  std::error_code size_error, time_error;
  const std::pair<std::uintmax_t, fs::file_time_type> stamp{fs::file_size(path, size_error),
                                                             fs::last_write_time(path, time_error)};
  const bool stamped = !size_error && !time_error;
  std::lock_guard<std::mutex> lock(mutex);
  if (stamped && kept && kept_path == path && kept_stamp == stamp) return kept;
  std::shared_ptr<const Tokenizer> loaded = load_tokenizer(path);
  if (stamped) std::tie(kept_path, kept_stamp, kept) = std::make_tuple(path, stamp, loaded);
  return loaded;
}

// text:... tokenized with --tokenizer as it is read: each file a document
// after the tokenizer's separator (Note [corpus shards]), uint32 tokens in
// memory. For small data: a large corpus is tandem tokenize's.
std::shared_ptr<const TokenStream> tokenized_text(const std::string& spec, const std::vector<std::string>& files,
                                                  const TokenOptions& o) {
  constexpr int64_t kMostBytes = int64_t(256) << 20;
  int64_t bytes = 0;
  std::error_code ec;
  for (const auto& f : files) bytes += static_cast<int64_t>(fs::file_size(f, ec));
  TANDEM_CHECK_USAGE(bytes <= kMostBytes, spec, ": ", bytes, " bytes of text; --tokenizer tokenizes at most 256 MiB "
                     "as it reads (tandem tokenize writes shards of any size for --data tokens:DIR)");
  const auto tokenizer = shared_tokenizer(o.tokenizer);
  const auto separator = tokenizer->document_separator();
  TANDEM_CHECK_USAGE(separator.has_value(), "--tokenizer ", o.tokenizer, ": the tokenizer has no end-of-text or "
                     "begin-of-text token to write before each document");
  const int64_t vocab = o.vocab_size > 0 ? o.vocab_size : tokenizer->vocab_size();
  TANDEM_CHECK_USAGE(vocab >= tokenizer->vocab_size(), "--vocab-size ", o.vocab_size, ": smaller than --tokenizer ",
                     o.tokenizer, "'s ", tokenizer->vocab_size(), " tokens");
  std::vector<uint32_t> tokens;
  for (const auto& f : files) {
    tokens.push_back(static_cast<uint32_t>(*separator));
    for (const int32_t id : tokenizer->encode(read_regular_file(f, "a text file"), f)) {
      tokens.push_back(static_cast<uint32_t>(id));
    }
  }
  TokenLayout layout;
  layout.width = 4;
  layout.count = static_cast<int64_t>(tokens.size());
  layout.vocab_size = vocab;
  layout.format = "text tokenized by " + tokenizer->describe();
  std::string raw(reinterpret_cast<const char*>(tokens.data()), tokens.size() * sizeof(uint32_t));
  return std::make_shared<const TokenStream>(std::move(raw), layout, spec);
}

// The stream of `files` of `kind`, tokenized or with the tokenizer's
// vocabulary when --tokenizer is given.
std::shared_ptr<const TokenStream> token_stream(const std::string& kind, const std::string& spec,
                                                const std::vector<std::string>& files, const TokenOptions& o) {
  if (o.tokenizer.empty()) return std::make_shared<const TokenStream>(kind, files, o.vocab_size);
  if (kind == "text") return tokenized_text(spec, files, o);
  const int64_t tokenizer_vocab = shared_tokenizer(o.tokenizer)->vocab_size();
  TANDEM_CHECK_USAGE(o.vocab_size == 0 || o.vocab_size >= tokenizer_vocab, "--vocab-size ", o.vocab_size,
                     ": smaller than --tokenizer ", o.tokenizer, "'s ", tokenizer_vocab, " tokens");
  return std::make_shared<const TokenStream>(kind, files, o.vocab_size > 0 ? o.vocab_size : tokenizer_vocab);
}

}  // namespace

std::vector<std::string> token_spec_files(const std::string& kind, const std::string& path) {
  const std::string spec = kind + ":" + path;
  TANDEM_CHECK_USAGE(kind == "text" || kind == "tokens", "token data: unknown kind '", kind, "'");
  return kind == "text" ? text_files(spec, path) : token_files(spec, path);
}

std::shared_ptr<const Dataset> open_token_eval(const std::string& kind, const std::string& path,
                                               const TokenOptions& o) {
  const std::string spec = kind + ":" + path;
  TANDEM_CHECK_USAGE(o.seq_len > 0, "--seq-len: expected a positive number of tokens, got ", o.seq_len);
  auto stream = token_stream(kind, spec, token_spec_files(kind, path), o);
  TANDEM_CHECK(stream->size() >= o.seq_len + 1, spec, ": ", stream->size(), " tokens, fewer than one window of --seq-len ",
               o.seq_len, " + 1");
  return std::make_shared<TokenDataset>(stream, 0, stream->size(), o.seq_len,
                                        spec + " (" + stream->describe() + ", " + stream->format() + ")");
}

DataSplits open_tokens(const std::string& kind, const std::string& path, const TokenOptions& o) {
  const std::string spec = kind + ":" + path;
  TANDEM_CHECK_USAGE(o.seq_len > 0, "--seq-len: expected a positive number of tokens, got ", o.seq_len);
  TANDEM_CHECK_USAGE(o.vocab_size >= 0, "--vocab-size: expected a positive size (0: the data's own), got ",
                     o.vocab_size);
  DataSplits splits;
  if (kind == "text") {
    TANDEM_CHECK_USAGE(o.vocab_size == 0 || o.vocab_size >= 256, "--vocab-size ", o.vocab_size,
                       ": text data are bytes, a vocabulary of 256");
    auto stream = token_stream(kind, spec, text_files(spec, path), o);
    const int64_t n = stream->size();
    const auto held_out = static_cast<int64_t>(std::floor(static_cast<double>(n) * o.val_fraction));
    const int64_t need = o.seq_len + 1;
    TANDEM_CHECK(n - held_out >= need && held_out >= need, spec, ": ", n, o.tokenizer.empty() ? " bytes" : " tokens",
                 "; its training part (", n - held_out,
                 ") and its held-out tail (", held_out, ", a tenth) each need one window of --seq-len ", o.seq_len,
                 " + 1 tokens");
    const std::string what = spec + " (" + stream->describe() + ")";
    splits.train = std::make_shared<TokenDataset>(stream, 0, n - held_out, o.seq_len, what + " train");
    splits.test = std::make_shared<TokenDataset>(stream, n - held_out, held_out, o.seq_len, what + " held-out tail");
    return splits;
  }
  TANDEM_CHECK_USAGE(kind == "tokens", "token data: unknown kind '", kind, "'");
  std::vector<std::string> train, val;
  for (auto& f : token_files(spec, path)) (validation_file(f) ? val : train).push_back(std::move(f));
  TANDEM_CHECK(!train.empty(), spec, ": every file is a validation one (*_val_*, val.bin); no training tokens");
  auto train_stream = token_stream(kind, spec, train, o);
  splits.train = std::make_shared<TokenDataset>(train_stream, 0, train_stream->size(), o.seq_len,
                                                spec + " train (" + train_stream->describe() + ", " +
                                                    train_stream->format() + ")");
  if (!val.empty()) {
    auto val_stream = token_stream(kind, spec, val, o);
    TANDEM_CHECK(val_stream->format() == train_stream->format() &&
                     val_stream->vocab_size() == train_stream->vocab_size(),
                 spec, ": validation files of ", val_stream->format(), " tokens (vocabulary ", val_stream->vocab_size(),
                 "), training files of ", train_stream->format(), " (", train_stream->vocab_size(), ")");
    splits.test = std::make_shared<TokenDataset>(val_stream, 0, val_stream->size(), o.seq_len,
                                                 spec + " validation (" + val_stream->describe() + ")");
  }
  return splits;
}

}  // namespace tandem::data
