// tandem/data/tokenize_corpus.h: a corpus of documents into llm.c's token
// shards (tandem tokenize), read back by --data tokens:DIR.
//
// Note [corpus shards]: each document is the tokenizer's document
// separator (tokenizer.h) then its tokens, as llm.c's scripts write them.
// A text file is one document; a .jsonl file one document a line (its
// "text"). Documents keep the inputs' order (a folder's files in name
// order); with a validation fraction F, document i goes to validation when
// floor((i + 1) F) > floor(i F), F of them spread evenly. Shards hold at
// most shard_tokens tokens: <out>/tokens_train_000000.bin, ..., and
// tokens_val_000000.bin, ..., uint16 tokens (llm.c's GPT-2 header) for a
// vocabulary of at most 65,536, else uint32 (its LLaMA 3 header). They
// are written under temporary names and renamed only when every document
// has been read: a document that is not UTF-8 ends the run naming its file
// (and line) and leaves nothing behind.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"

namespace tandem::data {

struct TokenizeOptions {
  std::vector<std::string> inputs;  // files, folders (every file below, in name order), globs
  std::string out;                  // the folder the shards go in (made if missing)
  double val_fraction = 0.0;        // of the documents, 0 to 0.5
  int64_t shard_tokens = 100'000'000;
  int threads = 0;  // 0: every core
};

struct TokenizeSummary {
  int64_t documents = 0, val_documents = 0;
  int64_t tokens = 0, val_tokens = 0;
  int64_t bytes = 0;  // the documents' text
  std::vector<std::string> shards;
  double seconds = 0;
};

// The inputs' files, in order; throws tandem::UsageError naming an input
// that names nothing (before anything is written).
std::vector<std::string> corpus_files(const std::vector<std::string>& inputs);

// Tokenizes the corpus (Note [corpus shards]). `progress(bytes_done,
// bytes_total)` is called as documents finish. Throws tandem::UsageError
// for bad input (nothing written).
TokenizeSummary tokenize_corpus(const Tokenizer& tokenizer, const TokenizeOptions& options,
                                const std::function<void(int64_t, int64_t)>& progress);

}  // namespace tandem::data
