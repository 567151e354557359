// A corpus into llm.c's token shards (tokenize_corpus.h, Note [corpus shards]).
#include "tandem/data/tokenize_corpus.h"

#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "tandem/data/tokens.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "text_unicode.h"
#include "token_shard_writer.h"

namespace tandem::data {
namespace {

namespace fs = std::filesystem;

// One document: its text and where it came from (for messages).
struct Document {
  std::string text, where;
};

// The documents of one file, in order: the whole file, or a .jsonl's lines.
void read_documents(const std::string& file, const std::function<void(Document&&)>& out) {
  auto bytes = read_regular_file(file, "a text or .jsonl file");
  if (fs::path(file).extension() != ".jsonl") {
    out({std::move(bytes), file});
    return;
  }
  size_t start = 0;
  for (int64_t line = 1; start < bytes.size(); ++line) {
    size_t end = bytes.find('\n', start);
    if (end == std::string::npos) end = bytes.size();
    const std::string_view text(bytes.data() + start, end - start);
    start = end + 1;
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;  // a blank line
    const auto where = file + ":" + std::to_string(line);
    try {
      text::check_utf8(text, where);
    } catch (const Error& e) {
      throw UsageError(e.what());
    }
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK_USAGE(!j.is_discarded() && j.is_object(), where, ": not a JSON object (a .jsonl file has one "
                       "document a line, {\"text\": ...})");
    TANDEM_CHECK_USAGE(j.contains("text") && j["text"].is_string(), where, ": no \"text\" string");
    out({j["text"].get<std::string>(), where});
  }
}


}  // namespace

std::vector<std::string> corpus_files(const std::vector<std::string>& inputs) {
  TANDEM_CHECK_USAGE(!inputs.empty(), "no inputs: give text files, .jsonl files, folders or globs to tokenize");
  std::vector<std::string> files;
  for (const auto& input : inputs) {
    std::error_code ec;
    if (fs::is_directory(input, ec)) {
      std::vector<std::string> below;
      for (const auto& entry : fs::recursive_directory_iterator(input, ec)) {
        if (entry.is_regular_file()) below.push_back(entry.path().string());
      }
      TANDEM_CHECK_USAGE(!ec, input, ": cannot list the folder (", ec.message(), ")");
      TANDEM_CHECK_USAGE(!below.empty(), input, ": the folder holds no files");
      std::sort(below.begin(), below.end());
      files.insert(files.end(), below.begin(), below.end());
    } else if (fs::exists(input, ec)) {
      check_regular_file(input, "a text or .jsonl file");
      files.push_back(input);
    } else {
      glob_t g{};
      const int rc = glob(input.c_str(), 0, nullptr, &g);
      std::vector<std::string> matched;
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
        if (fs::is_regular_file(g.gl_pathv[i], ec)) matched.push_back(g.gl_pathv[i]);
      }
      globfree(&g);
      TANDEM_CHECK_USAGE(!matched.empty(), input, ": no such file or folder, and no file matches it as a glob");
      files.insert(files.end(), matched.begin(), matched.end());  // glob sorts them
    }
  }
  return files;
}

TokenizeSummary tokenize_corpus(const Tokenizer& tokenizer, const TokenizeOptions& o,
                                const std::function<void(int64_t, int64_t)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  TANDEM_CHECK_USAGE(o.val_fraction >= 0 && o.val_fraction <= 0.5, "--val-fraction ", o.val_fraction,
                     ": a share of the documents from 0 to 0.5");
  TANDEM_CHECK_USAGE(o.shard_tokens >= 1 && o.shard_tokens <= INT32_MAX, "--shard-tokens ", o.shard_tokens,
                     ": from 1 to 2^31 - 1 (llm.c's header counts the tokens in an int32)");
  const auto separator = tokenizer.document_separator();
  TANDEM_CHECK_USAGE(separator.has_value(), tokenizer.path(), ": the tokenizer has no end-of-text or "
                     "begin-of-text token to write before each document");
  const auto files = corpus_files(o.inputs);
  std::error_code ec;
  fs::create_directories(o.out, ec);
  TANDEM_CHECK_USAGE(fs::is_directory(o.out, ec), "--out ", o.out, ": not a folder, and cannot be made one");
  for (const auto& entry : fs::directory_iterator(o.out, ec)) {
    const auto name = entry.path().filename().string();
    TANDEM_CHECK_USAGE(name.rfind("tokens_train_", 0) != 0 && name.rfind("tokens_val_", 0) != 0, "--out ", o.out,
                       " already holds ", name, ": tandem tokenize does not overwrite shards (give an empty folder)");
  }
  int64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<int64_t>(fs::file_size(f, ec));

  const bool wide = tokenizer.vocab_size() > 65536;
  internal::TokenShardWriter train(o.out, "train", o.shard_tokens, wide), val(o.out, "val", o.shard_tokens, wide);
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  TokenizeSummary s;
  int64_t bytes_done = 0;
  std::vector<Document> batch;
  std::vector<std::vector<int32_t>> encoded;
  auto encode_batch = [&] {
    encoded.assign(batch.size(), {});
    std::vector<std::exception_ptr> errors(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        try {
          for (size_t i = t; i < batch.size(); i += threads) {
            encoded[i] = tokenizer.encode(batch[i].text, batch[i].where);
          }
        } catch (const std::exception& e) {
          errors[t] = std::current_exception();
        }
      });
    }
    for (auto& th : pool) th.join();
    for (auto& e : errors) {
      if (!e) continue;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& error) {
        throw UsageError(error.what());
      }
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      const int64_t n = s.documents++;
      const bool to_val = o.val_fraction > 0 && std::floor(double(n + 1) * o.val_fraction) >
                                                    std::floor(double(n) * o.val_fraction);
      auto& writer = to_val ? val : train;
      const std::vector<int32_t> first = {*separator};
      writer.add(first);
      writer.add(encoded[i]);
      const int64_t count = static_cast<int64_t>(encoded[i].size()) + 1;
      s.tokens += count;
      if (to_val) {
        ++s.val_documents;
        s.val_tokens += count;
      }
      s.bytes += static_cast<int64_t>(batch[i].text.size());
    }
    batch.clear();
  };
  size_t batch_bytes = 0;
  for (const auto& file : files) {
    read_documents(file, [&](Document&& d) {
      batch_bytes += d.text.size();
      batch.push_back(std::move(d));
      if (batch_bytes >= (size_t(8) << 20) || batch.size() >= size_t(threads) * 64) {
        encode_batch();
        bytes_done += static_cast<int64_t>(batch_bytes);
        batch_bytes = 0;
        if (progress) progress(std::min(bytes_done, total_bytes), total_bytes);
      }
    });
  }
  if (!batch.empty()) encode_batch();
  TANDEM_CHECK_USAGE(s.documents > 0, "the inputs hold no document (every .jsonl line blank?): nothing to tokenize");
  if (progress) progress(total_bytes, total_bytes);
  s.shards = train.commit();
  const auto vals = val.commit();
  s.shards.insert(s.shards.end(), vals.begin(), vals.end());
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return s;
}

}  // namespace tandem::data
