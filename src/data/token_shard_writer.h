// The shards of one split of tandem tokenize (Note [corpus shards] in
// tandem/data/tokenize_corpus.h), written so that a run that fails or is
// stopped leaves nothing behind.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/util/removed_on_signal.h"

namespace tandem::data::internal {

// Note [one spill file]: the tokens go to one temporary file a split
// (<out>/tokens_<split>.tmp-<pid>), which the signals SIGINT and SIGTERM
// remove (RemovedOnSignal holds 16 paths; a corpus has thousands of
// shards); commit() cuts it into shards under llm.c's header, each written
// to a temporary and renamed, one at a time, and removes the spill.
class TokenShardWriter {
 public:
  TokenShardWriter(std::string out, std::string split, int64_t shard_tokens, bool wide);
  ~TokenShardWriter();
  TokenShardWriter(const TokenShardWriter&) = delete;
  TokenShardWriter& operator=(const TokenShardWriter&) = delete;

  void add(const std::vector<int32_t>& tokens);
  // The shards, named tokens_<split>_000000.bin ...; none when no token came.
  std::vector<std::string> commit();

 private:
  std::string out_, split_, spill_;
  int64_t shard_tokens_;
  bool wide_;
  int64_t count_ = 0;
  int fd_ = -1;
  std::unique_ptr<RemovedOnSignal> guard_;
};

}  // namespace tandem::data::internal
