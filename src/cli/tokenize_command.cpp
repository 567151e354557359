// tandem tokenize: a corpus into llm.c's token shards with a tokenizer
// (data/tokenize_corpus.h), for --data tokens:DIR.
#include <cstdio>
#include <string>
#include <vector>

#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/data/tokenize_corpus.h"
#include "tandem/data/tokenizer.h"
#include "tandem/util/check.h"
#include "tandem/util/progress.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

struct TokenizeFlags {
  std::string tokenizer;
  data::TokenizeOptions options;
  int64_t threads = 0;
};

FlagSet tokenize_flags(TokenizeFlags& f) {
  FlagSet flags("tandem tokenize",
                "Tokenize text into llm.c's token shards for --data tokens:DIR. usage: tandem tokenize "
                "--tokenizer FILE --out DIR [flags] INPUTS... where INPUTS are text files (a document each), "
                ".jsonl files (a document a line's \"text\"), folders (every file below, in name order) or "
                "globs. Each document is written after the tokenizer's end-of-text (GPT-2) or begin-of-text "
                "(LLaMA 3, SentencePiece) token, as llm.c's scripts write them: out/tokens_train_000000.bin "
                "..., and tokens_val_... with --val-fraction; uint16 tokens for vocabularies of at most 65,536, "
                "else uint32. Text that is not UTF-8 is refused naming its file and nothing is written.");
  flags.add_string("tokenizer", "FILE", &f.tokenizer,
                   "a Hugging Face tokenizer.json (byte-level BPE: GPT-2, LLaMA 3, Qwen) or a SentencePiece "
                   ".model (LLaMA 2, Mistral); required");
  flags.add_string("out", "DIR", &f.options.out, "the folder the shards go in (made if missing; required)");
  flags.add_double("val-fraction", "F", &f.options.val_fraction,
                   "the share of the documents held out for validation, spread evenly (0: none, all in input "
                   "order)", 0, 0.5, "from 0 to 0.5");
  flags.add_int("shard-tokens", "N", &f.options.shard_tokens, "tokens a shard at most (llm.c's 10^8)", 1);
  flags.add_int("threads", "N", &f.threads, "encoding threads (0: every core)", 0);
  return flags;
}

// The flags (each takes a value) apart from the inputs.
std::vector<std::string> split_inputs(const std::vector<std::string>& args, std::vector<std::string>& flag_args) {
  std::vector<std::string> inputs;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a == "--") {
      inputs.insert(inputs.end(), args.begin() + static_cast<std::ptrdiff_t>(i) + 1, args.end());
      break;
    }
    if (a.rfind("--", 0) == 0 || a == "-h") {
      flag_args.push_back(a);
      const bool takes_value = a.find('=') == std::string::npos && a != "--help" && a != "-h";
      if (takes_value && i + 1 < args.size()) flag_args.push_back(args[++i]);
    } else {
      inputs.push_back(a);
    }
  }
  return inputs;
}

}  // namespace

std::string tokenize_help() {
  TokenizeFlags f;
  return tokenize_flags(f).help();
}

int tokenize_command(const std::vector<std::string>& args) {
  TokenizeFlags f;
  auto flags = tokenize_flags(f);
  std::vector<std::string> flag_args;
  f.options.inputs = split_inputs(args, flag_args);
  flags.parse(flag_args);
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  TANDEM_CHECK_USAGE(!f.tokenizer.empty(), "--tokenizer FILE is required (a tokenizer.json or a SentencePiece "
                     ".model)");
  TANDEM_CHECK_USAGE(!f.options.out.empty(), "--out DIR is required (the folder the shards go in)");
  TANDEM_CHECK_USAGE(f.threads <= 4096, "--threads ", f.threads, ": at most 4096");
  f.options.threads = static_cast<int>(f.threads);
  data::corpus_files(f.options.inputs);  // every input named before the tokenizer is read
  const auto tokenizer = data::load_tokenizer(f.tokenizer);
  std::fprintf(stderr, "tokenizer: %s\n", tokenizer->describe().c_str());
  ProgressOptions po;
  po.label = "tokenizing";
  po.unit = "B";
  po.live = is_terminal(stderr);
  std::unique_ptr<Progress> bar;
  const auto s = data::tokenize_corpus(*tokenizer, f.options, [&](int64_t done, int64_t total) {
    if (!bar) {
      po.total = total;
      bar = std::make_unique<Progress>(po);
    }
    bar->update(done, done, "");
  });
  if (bar) bar->finish(s.bytes, s.bytes, "");
  if (f.options.val_fraction > 0 && s.val_documents == 0) {
    std::fprintf(stderr, "tandem: warning: --val-fraction %g of %lld documents holds out none: no validation "
                 "shard was written\n", f.options.val_fraction, static_cast<long long>(s.documents));
  }
  Table table({"split", "documents", "tokens", "shards"});
  int64_t train_shards = 0;
  for (const auto& shard : s.shards) train_shards += shard.find("tokens_train_") != std::string::npos;
  table.add_row({"train", std::to_string(s.documents - s.val_documents), std::to_string(s.tokens - s.val_tokens),
                 std::to_string(train_shards)});
  table.add_row({"val", std::to_string(s.val_documents), std::to_string(s.val_tokens),
                 std::to_string(static_cast<int64_t>(s.shards.size()) - train_shards)});
  std::printf("%s", table.render().c_str());
  std::printf("%lld documents, %lld tokens from %lld bytes (%.3f tokens a byte) in %.1f s (%.2f MB/s); "
              "train with --data tokens:%s\n",
              static_cast<long long>(s.documents), static_cast<long long>(s.tokens), static_cast<long long>(s.bytes),
              s.bytes > 0 ? double(s.tokens) / double(s.bytes) : 0.0, s.seconds,
              s.seconds > 0 ? double(s.bytes) / s.seconds / 1e6 : 0.0, f.options.out.c_str());
  return 0;
}

}  // namespace tandem::cli
