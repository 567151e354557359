// tandem/data/tokens.h: token data for language models.
//
//   text:FILE[,FILE...] or text:DIR   UTF-8 bytes as tokens (vocabulary 256);
//                                     the last tenth held out as validation
//   tokens:PATH_OR_GLOB               llm.c's token shards (a header of 256
//                                     int32: magic, version, token count; then
//                                     the tokens), *_val_* shards as
//                                     validation; or nanoGPT's headerless
//                                     uint16 .bin files (with --vocab-size),
//                                     val.bin as validation
//
// Note [token windows]: a split is one stream of tokens (its files one
// after another, in name order), cut into windows of seq_len + 1 tokens
// that start every seq_len tokens, as llm.c's and nanoGPT's loaders read
// them: sample i is tokens [i * seq_len, (i + 1) * seq_len], its inputs the
// first seq_len and its targets the last seq_len. Samples are indices, so
// the samplers shuffle them by (seed, epoch) and shard them over the ranks
// as they do images, and a checkpoint's (epoch, step) is the exact
// position. Files are mapped, not read: a split of billions of tokens costs
// address space, not memory. Every header is checked against the file's
// size, and every token against the vocabulary, before training starts.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

// llm.c's two shard kinds (dev/data/data_common.py).
inline constexpr int32_t kLlmcGpt2Magic = 20240520;    // version 1, uint16 tokens, GPT-2's 50257
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // version 7, uint32 tokens, LLaMA 3's 128256
inline constexpr int64_t kLlmcHeaderBytes = 256 * 4;

// The tokens of one file: where they start in its bytes, how wide each is.
struct TokenLayout {
  int64_t offset = 0;      // bytes before the first token
  int64_t width = 1;       // bytes per token: 1 (text), 2 or 4
  int64_t count = 0;       // tokens
  int64_t vocab_size = 0;  // the format's vocabulary (0: unknown, a flag must say)
  std::string format;      // "text", "llm.c gpt-2", "llm.c llama-3", "nanoGPT uint16"
};

// Reads the layout of a token file from its bytes. `kind` is "text" or
// "tokens"; a tokens file without an llm.c magic is nanoGPT's headerless
// uint16 layout. Throws tandem::Error naming `name` for a header that lies
// (a token count the size does not hold, an unknown version) or a size that
// is not a whole number of tokens.
TokenLayout token_layout(const std::string& kind, const uint8_t* data, int64_t size, const std::string& name);

// One split: the files' tokens one after another (Note [token windows]).
class TokenStream {
 public:
  struct Piece;
  // Maps `paths` (regular files, in this order). `vocab_size` overrides the
  // format's (0: the format's); a token at or past it is refused, naming
  // the file and the token's position.
  TokenStream(const std::string& kind, const std::vector<std::string>& paths, int64_t vocab_size);
  // A stream over tokens in memory (tests, the fuzz target): `bytes` laid
  // out as `layout` says.
  TokenStream(std::string bytes, const TokenLayout& layout, const std::string& name);
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  int64_t size() const { return size_; }
  int64_t vocab_size() const { return vocab_size_; }
  const std::string& format() const { return format_; }
  // Tokens [start, start + count) into `out`, across files.
  void read(int64_t start, int64_t count, int64_t* out) const;
  // The tokens of [start, start + count) as they lie in the files' bytes
  // (for a digest).
  uint32_t crc32(int64_t start, int64_t count) const;
  // "3 files, 1234567 tokens"
  std::string describe() const;

 private:
  void finish(int64_t vocab_size);
  std::vector<std::unique_ptr<Piece>> pieces_;
  int64_t size_ = 0;
  int64_t vocab_size_ = 0;
  std::string format_;
};

// The windows of [first, first + count) tokens of a stream (Note [token
// windows]): inputs and targets [B, seq_len] int64.
class TokenDataset : public Dataset {
 public:
  TokenDataset(std::shared_ptr<const TokenStream> stream, int64_t first, int64_t count, int64_t seq_len,
               std::string description);
  int64_t size() const override { return windows_; }
  DatasetInfo info() const override;
  Batch get_batch(const std::vector<int64_t>& indices, int64_t epoch) const override;
  std::string describe() const override;
  uint32_t content_digest() const override;
  int64_t tokens() const { return count_; }

 private:
  std::shared_ptr<const TokenStream> stream_;
  int64_t first_, count_, seq_len_, windows_;
  std::string description_;
};

struct TokenOptions {
  int64_t seq_len = 0;     // --seq-len: tokens a sample's inputs hold
  int64_t vocab_size = 0;  // --vocab-size: 0 for the format's own
  double val_fraction = 0.1;  // text: the held-out tail
  // --tokenizer (tokenizer.h): text is tokenized with it as it is read,
  // each file a document after the tokenizer's separator (Note [corpus
  // shards]); tokens take its vocabulary unless vocab_size says otherwise.
  std::string tokenizer;
};

// Opens text:... or tokens:... (`kind`, `path` the spec after the colon):
// the training split and the validation split (null when a tokens glob
// names no validation shard). Throws tandem::Error naming the spec and the
// file at fault; a split too short for one window says how many tokens it
// has and how many --seq-len needs.
DataSplits open_tokens(const std::string& kind, const std::string& path, const TokenOptions& options);

// Evaluation data of text:... or tokens:... given on its own (--val-data):
// every file the spec names, validation shards or not, as one stream (a
// text file whole, not its tail).
std::shared_ptr<const Dataset> open_token_eval(const std::string& kind, const std::string& path,
                                               const TokenOptions& options);

// The files text:PATH or tokens:PATH names, in the order they are read;
// throws tandem::Error naming the spec when a file is missing or a glob or
// folder names none (a launcher's check before its workers start).
std::vector<std::string> token_spec_files(const std::string& kind, const std::string& path);

}  // namespace tandem::data
