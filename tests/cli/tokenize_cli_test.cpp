// tandem tokenize and --tokenizer through the CLI: shards hold each
// document after the tokenizer's separator, in order, split as
// --val-fraction says; a model trained on them and exported loads in
// transformers, whose greedy generate() on the tokenizer's ids continues
// a prompt as `tandem sample --temperature 0` does with the run's
// tokenizer; text tokenized as it is read trains and is recorded; bad
// input is named and leaves nothing written.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "tandem/data/tokenizer.h"
#include "tandem/data/tokens.h"
#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

// gpt2.json and sp_bpe.model trained on this repository's documentation
// (tests/data/tokenizer_reference.py), and that text in `dir`/train.txt.
void make_tokenizers(const TempDir& dir) {
  {
    std::ofstream train(dir.file("train.txt"), std::ios::binary);
    for (const auto& entry : std::filesystem::directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/docs")) {
      if (entry.path().extension() == ".md") train << testing::read_text(entry.path().string());
    }
  }
  std::ofstream(dir.file("cases.json")) << "[]";
  auto r = testing::run(std::string(TANDEM_PYTHON) + " " TANDEM_SOURCE_DIR "/tests/data/tokenizer_reference.py " +
                        dir.file("train.txt") + " " + dir.file("cases.json") + " " + dir.path() + " 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
}

// A shard's tokens, its header checked as llm.c's GPT-2 layout.
std::vector<int32_t> shard_tokens(const std::string& path) {
  const auto bytes = testing::read_text(path);
  int32_t header[256];
  EXPECT_GE(bytes.size(), sizeof(header));
  std::memcpy(header, bytes.data(), sizeof(header));
  EXPECT_EQ(header[0], data::kLlmcGpt2Magic);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(bytes.size(), sizeof(header) + 2 * size_t(header[2]));
  std::vector<int32_t> tokens(header[2]);
  for (int32_t i = 0; i < header[2]; ++i) {
    uint16_t t;
    std::memcpy(&t, bytes.data() + sizeof(header) + 2 * i, 2);
    tokens[i] = t;
  }
  return tokens;
}

std::vector<std::string> shards(const std::string& dir, const std::string& split) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("tokens_" + split + "_", 0) == 0) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(TokenizeCliTest, ShardsHoldEachDocumentAfterTheSeparatorInOrder) {
  TempDir dir;
  make_tokenizers(dir);
  std::filesystem::create_directories(dir.file("sub"));
  const std::vector<std::pair<std::string, std::string>> files = {
      {"a.txt", "The first document.\nIt has two lines."},
      {"sub/c.txt", "Caf\u00e9 \u6771\u4eac \U0001F600 <|endoftext|> inside"},
      {"sub/d.txt", "Numbers 12345 and spaces   \t end"},
  };
  for (const auto& [name, text] : files) std::ofstream(dir.file(name), std::ios::binary) << text;
  std::ofstream(dir.file("e.jsonl")) << "{\"text\": \"jsonl one\"}\n\n{\"text\": \"jsonl two\", \"id\": 7}\n"
                                        "{\"text\": \"jsonl three\"}\n";
  auto r = run_tandem("tokenize --tokenizer " + dir.file("gpt2.json") + " --out " + dir.file("out") +
                      " --val-fraction 0.25 --shard-tokens 16 --threads 3 " + dir.file("a.txt") + " " +
                      dir.file("sub") + " " + dir.file("e.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("6 documents"), std::string::npos) << r.output;
  const auto tokenizer = data::load_tokenizer(dir.file("gpt2.json"));
  const int32_t separator = *tokenizer->document_separator();
  // Documents in order: a, sub/c, sub/d, the three lines; with F = 0.25
  // document 3 (floor(4 F) > floor(3 F)) goes to validation.
  const std::vector<std::string> documents = {files[0].second, files[1].second, files[2].second,
                                              "jsonl one", "jsonl two", "jsonl three"};
  std::vector<int32_t> want_train, want_val;
  for (size_t i = 0; i < documents.size(); ++i) {
    auto& to = i == 3 ? want_val : want_train;
    to.push_back(separator);
    const auto ids = tokenizer->encode(documents[i]);
    to.insert(to.end(), ids.begin(), ids.end());
  }
  std::vector<int32_t> got_train, got_val;
  const auto train_shards = shards(dir.file("out"), "train");
  EXPECT_GE(train_shards.size(), 3u);  // 16 tokens a shard at most
  for (const auto& s : train_shards) {
    const auto t = shard_tokens(s);
    EXPECT_LE(t.size(), 16u);
    got_train.insert(got_train.end(), t.begin(), t.end());
  }
  for (const auto& s : shards(dir.file("out"), "val")) {
    const auto t = shard_tokens(s);
    got_val.insert(got_val.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got_train, want_train);
  EXPECT_EQ(got_val, want_val);
  // Control: the special token written in a document is one token.
  const auto c = tokenizer->encode(files[1].second);
  EXPECT_EQ(std::count(c.begin(), c.end(), separator), 1);
}

// The model: a tiny Qwen3 (q/k norms, a head size of 48 rather than the
// width's 32, tied) that tandem builds from a transformers config.json.
TEST(TokenizeCliTest, TransformersContinuesATokenizedRunAsSampleDoes) {
  TempDir dir;
  make_tokenizers(dir);
  auto r = run_tandem("tokenize --tokenizer " + dir.file("gpt2.json") + " --out " + dir.file("out") +
                      " --val-fraction 0.1 " + dir.file("train.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::create_directories(dir.file("qwen3"));
  std::ofstream(dir.file("qwen3/config.json")) << R"({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
    "vocab_size": 1280, "hidden_size": 128, "intermediate_size": 352, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48, "max_position_embeddings": 256,
    "rms_norm_eps": 1e-06, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
    "hidden_act": "silu", "attention_bias": false, "tie_word_embeddings": true, "use_sliding_window": false,
    "sliding_window": null, "max_window_layers": 28, "bos_token_id": null, "eos_token_id": null})";
  r = run_tandem("train --model hf:" + dir.file("qwen3") + " --data tokens:" + dir.file("out") + " --tokenizer " +
                 dir.file("gpt2.json") +
                 " --seq-len 32 --batch-size 8 --lr 3e-3 --max-steps 100 --dtype float64 --progress off --export-hf " +
                 dir.file("hf"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string prompt = "The planner predicts";
  auto sampled = run_tandem("sample --weights " + dir.file("hf") + " --prompt '" + prompt +
                            "' --max-tokens 24 --temperature 0");
  ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
  std::ofstream(dir.file("generate.py")) << R"(
import sys, torch
sys.path.insert(0, sys.argv[1])
import transformers_peer
transformers_peer.keep_float64_rms_norm()
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM
from transformers.utils import logging
logging.disable_progress_bar()
tok = Tokenizer.from_file(sys.argv[2])
model = AutoModelForCausalLM.from_pretrained(sys.argv[3])
assert model.dtype == torch.float64, model.dtype
ids = torch.tensor([tok.encode(sys.argv[4], add_special_tokens=False).ids])
out = model.generate(ids, max_new_tokens=24, do_sample=False)
sys.stdout.write(tok.decode(out[0].tolist(), skip_special_tokens=False) + "\n")
)";
  auto generated = testing::run("HF_HUB_OFFLINE=1 " + std::string(TANDEM_PYTHON) + " " + dir.file("generate.py") +
                                " " TANDEM_SOURCE_DIR "/tests/testing " + dir.file("gpt2.json") + " " +
                                dir.file("hf") + " '" + prompt + "'");
  ASSERT_EQ(generated.exit_code, 0) << generated.output;
  EXPECT_EQ(sampled.output, generated.output) << "tandem sample, then transformers' generate()";
  // Control: the prompt came back, and its 24 tokens' continuation after it
  // (which this small model may spend on one repeated token, as it does on
  // the docs of some commits: the comparison is of ids either way).
  EXPECT_EQ(sampled.output.rfind(prompt, 0), 0u) << sampled.output;
  EXPECT_GE(sampled.output.size(), prompt.size() + 12) << sampled.output;
}

TEST(TokenizeCliTest, TextTokenizedAsItIsReadTrainsAndIsRecorded) {
  TempDir dir;
  make_tokenizers(dir);
  for (const char* tokenizer : {"gpt2.json", "sp_bpe.model"}) {
    const std::string weights = dir.file(std::string(tokenizer) + ".safetensors");
    auto r = run_tandem("train --model gpt2-tiny --data text:" + dir.file("train.txt") + " --tokenizer " +
                        dir.file(tokenizer) + " --seq-len 32 --batch-size 8 --max-steps 3 --progress off "
                        "--export-weights " + weights + " --metrics-out " + dir.file("m.jsonl"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto vocab = data::load_tokenizer(dir.file(tokenizer))->vocab_size();
    // The model's vocabulary is the tokenizer's: its last id is one, the
    // next is not; the figures are per token, not bits per byte.
    auto last = run_tandem("sample --weights " + weights + " --prompt-ids " + std::to_string(vocab - 1) +
                           " --max-tokens 1");
    EXPECT_EQ(last.exit_code, 0) << last.output;
    EXPECT_TRUE(testing::tandem_fails("sample --weights " + weights + " --prompt-ids " + std::to_string(vocab) +
                                          " --max-tokens 1",
                                      2, "--prompt-ids"));
    const auto m = testing::last_metrics(dir.file("m.jsonl"));
    EXPECT_FALSE(m.contains("train_bits_per_byte")) << m.dump();
    auto sampled = run_tandem("sample --weights " + weights + " --prompt 'The data' --max-tokens 8");
    ASSERT_EQ(sampled.exit_code, 0) << sampled.output;
    EXPECT_EQ(sampled.output.rfind("The data", 0), 0u) << sampled.output;
    auto evaluated = run_tandem("eval --weights " + weights);
    ASSERT_EQ(evaluated.exit_code, 0) << evaluated.output;
  }
}

TEST(TokenizeCliTest, BadInputIsNamedAndNothingIsWritten) {
  TempDir dir;
  make_tokenizers(dir);
  std::ofstream(dir.file("good.txt")) << "a good document";
  std::ofstream(dir.file("bad.txt"), std::ios::binary) << "starts well \xC3\x28 then not";
  const std::string tokenize = "tokenize --tokenizer " + dir.file("gpt2.json") + " --out " + dir.file("out") + " ";
  EXPECT_TRUE(testing::tandem_fails(tokenize + dir.file("good.txt") + " " + dir.file("bad.txt"), 2,
                                    "bad.txt is not UTF-8: byte offset 12"));
  EXPECT_TRUE(!std::filesystem::exists(dir.file("out")) || std::filesystem::is_empty(dir.file("out")));
  std::ofstream(dir.file("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n";
  EXPECT_TRUE(testing::tandem_fails(tokenize + dir.file("bad.jsonl"), 2, "bad.jsonl:2: no \"text\" string"));
  EXPECT_TRUE(testing::tandem_fails(tokenize + dir.file("absent.txt"), 2, "absent.txt: no such file or folder"));
  EXPECT_TRUE(testing::tandem_fails("tokenize --tokenizer " + dir.file("wordpiece.json") + " --out " +
                                        dir.file("out") + " " + dir.file("good.txt"),
                                    2, "wordpiece.json: model.type \"WordPiece\""));
  EXPECT_TRUE(testing::tandem_fails(tokenize + "--val-fraction 0.9 " + dir.file("good.txt"), 2, "--val-fraction"));
  EXPECT_TRUE(!std::filesystem::exists(dir.file("out")) || std::filesystem::is_empty(dir.file("out")));
  auto r = run_tandem(tokenize + dir.file("good.txt"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::tandem_fails(tokenize + dir.file("good.txt"), 2, "already holds tokens_train_000000.bin"));
  EXPECT_TRUE(testing::tandem_fails("train --model gpt2-tiny --data text:" + dir.file("good.txt") + " --tokenizer " +
                                        dir.file("absent.json"),
                                    2, "absent.json: no such file"));
  EXPECT_TRUE(testing::tandem_fails("train --model gpt2-tiny --seq-len 4 --data tokens:" + dir.file("out") +
                                        " --tokenizer " + dir.file("gpt2.json") + " --vocab-size 300",
                                    2, "--vocab-size 300: smaller than --tokenizer"));
  std::ofstream(dir.file("blank.jsonl")) << "\n\n";
  EXPECT_TRUE(testing::tandem_fails("tokenize --tokenizer " + dir.file("gpt2.json") + " --out " + dir.file("none") +
                                        " " + dir.file("blank.jsonl"),
                                    2, "the inputs hold no document"));
}

// Stopped while it writes, tandem tokenize leaves no temporary behind
// (Note [one spill file]: one a split, which the signal removes).
TEST(TokenizeCliTest, AStoppedRunLeavesNoTemporaries) {
  TempDir dir;
  make_tokenizers(dir);
  {
    std::ofstream big(dir.file("big.txt"));
    const auto text = testing::read_text(dir.file("train.txt"));
    while (big.tellp() < (int64_t(24) << 20)) big << text;
  }
  std::ofstream(dir.file("stop.sh")) << "\"$1\" tokenize --tokenizer \"$2\" --out \"$3\" --shard-tokens 1000 \"$4\" &\n"
                                        "pid=$!\n"
                                        "for i in $(seq 400); do ls \"$3\"/*.tmp-* >/dev/null 2>&1 && break; sleep 0.02; done\n"
                                        "sleep 0.5; kill -TERM $pid; wait $pid; echo \"status $?\"\n";
  auto r = testing::run("sh " + dir.file("stop.sh") + " " TANDEM_CLI " " + dir.file("gpt2.json") + " " +
                        dir.file("out") + " " + dir.file("big.txt"));
  EXPECT_NE(r.output.find("status 143"), std::string::npos) << r.output;  // ended by SIGTERM
  for (const auto& e : std::filesystem::directory_iterator(dir.file("out"))) {
    EXPECT_EQ(e.path().string().find(".tmp-"), std::string::npos) << e.path();
  }
}

}  // namespace
}  // namespace tandem
