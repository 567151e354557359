// Token data (data/tokens.h): text files as bytes, llm.c's shards and
// nanoGPT's .bin files (written by numpy, as nanoGPT's prepare.py does),
// the windows of Note [token windows], and every lie a header can tell.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/torch.h>

#include <cstring>
#include <fstream>
#include <optional>

#include "tandem/data/tokens.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::data {
namespace {

using testing::TempDir;

void write(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// An llm.c shard as its write_datafile lays it out: 256 little-endian
// int32 (magic, version, token count, zeros), then the tokens.
// `claimed`: the token count the header gives, when not the true one.
std::string shard(int32_t magic, int32_t version, const std::vector<int64_t>& tokens, int width,
                  std::optional<int32_t> claimed = std::nullopt) {
  std::string bytes(kLlmcHeaderBytes, '\0');
  const int32_t header[3] = {magic, version, claimed.value_or(static_cast<int32_t>(tokens.size()))};
  std::memcpy(bytes.data(), header, sizeof header);
  for (auto t : tokens) {
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<char>((t >> (8 * b)) & 0xff));
  }
  return bytes;
}

std::vector<int64_t> row(const torch::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return {r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel()};
}

using testing::error_of;

TEST(TokensTest, TextIsBytesWithTheLastTenthHeldOut) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text.push_back(static_cast<char>('a' + i % 26));
  text[7] = static_cast<char>(0xc3);  // UTF-8 bytes are tokens 128..255
  write(dir.file("t.txt"), text);
  auto splits = open_tokens("text", dir.file("t.txt"), {/*seq_len=*/8});
  auto train = std::static_pointer_cast<const TokenDataset>(splits.train);
  auto test = std::static_pointer_cast<const TokenDataset>(splits.test);
  EXPECT_EQ(train->tokens(), 180);
  EXPECT_EQ(test->tokens(), 20);
  EXPECT_EQ(train->size(), (180 - 1) / 8);
  EXPECT_EQ(test->size(), (20 - 1) / 8);
  EXPECT_EQ(train->info().num_classes, 256);
  EXPECT_EQ(train->info().seq_len, 8);
  // Window i: inputs bytes [8i, 8i + 8), targets the same shifted by one.
  auto batch = train->get_batch({0, 3}, 0);
  ASSERT_EQ(batch.inputs.sizes(), (std::vector<int64_t>{2, 8}));
  ASSERT_EQ(batch.targets.sizes(), (std::vector<int64_t>{2, 8}));
  for (int64_t j = 0; j < 8; ++j) {
    EXPECT_EQ(row(batch.inputs, 0)[j], static_cast<uint8_t>(text[j]));
    EXPECT_EQ(row(batch.targets, 0)[j], static_cast<uint8_t>(text[j + 1]));
    EXPECT_EQ(row(batch.inputs, 1)[j], static_cast<uint8_t>(text[24 + j]));
  }
  EXPECT_EQ(row(batch.inputs, 0)[7], 0xc3);
  auto held = test->get_batch({1}, 0);
  EXPECT_EQ(row(held.inputs, 0)[0], static_cast<uint8_t>(text[180 + 8]));
  EXPECT_NE(train->describe().find("180 tokens, 22 windows of 8"), std::string::npos) << train->describe();
  EXPECT_NE(train->content_digest(), test->content_digest());
}

TEST(TokensTest, SeveralTextFilesOrAFolderAreOneStream) {
  TempDir dir;
  ::mkdir(dir.file("corpus").c_str(), 0755);
  write(dir.file("corpus/b.txt"), std::string(60, 'b'));
  write(dir.file("corpus/a.txt"), std::string(60, 'a'));
  write(dir.file("corpus/.hidden"), "zzz");
  auto folder = open_tokens("text", dir.file("corpus"), {4});
  auto listed = open_tokens("text", dir.file("corpus/a.txt") + "," + dir.file("corpus/b.txt"), {4});
  EXPECT_EQ(folder.train->content_digest(), listed.train->content_digest());
  // Name order: a's bytes, then b's; window 14 spans the two files.
  auto batch = folder.train->get_batch({14}, 0);
  EXPECT_EQ(row(batch.inputs, 0), (std::vector<int64_t>{'a', 'a', 'a', 'a'}));
  EXPECT_EQ(row(batch.targets, 0), (std::vector<int64_t>{'a', 'a', 'a', 'b'}));
}

TEST(TokensTest, LlmcShardsOfBothMagicsWithValidationByName) {
  TempDir dir;
  write(dir.file("fw_train_000001.bin"), shard(kLlmcGpt2Magic, 1, {50256, 15496, 11, 995, 0, 50256, 7, 8, 9}, 2));
  write(dir.file("fw_train_000002.bin"), shard(kLlmcGpt2Magic, 1, {10, 11, 12, 13}, 2));
  write(dir.file("fw_val_000000.bin"), shard(kLlmcGpt2Magic, 1, {50256, 1, 2, 3, 4}, 2));
  auto splits = open_tokens("tokens", dir.file("fw_*.bin"), {4});
  ASSERT_TRUE(splits.test);
  EXPECT_EQ(splits.train->info().num_classes, 50257);
  EXPECT_EQ(std::static_pointer_cast<const TokenDataset>(splits.train)->tokens(), 13);
  EXPECT_EQ(splits.train->size(), 3);
  auto b = splits.train->get_batch({2}, 0);  // tokens 8..12: 9 from the first shard, then the second's
  EXPECT_EQ(row(b.inputs, 0), (std::vector<int64_t>{9, 10, 11, 12}));
  EXPECT_EQ(row(b.targets, 0), (std::vector<int64_t>{10, 11, 12, 13}));
  EXPECT_EQ(row(splits.test->get_batch({0}, 0).inputs, 0), (std::vector<int64_t>{50256, 1, 2, 3}));
  EXPECT_NE(splits.train->describe().find("llm.c gpt-2"), std::string::npos) << splits.train->describe();
  // A folder means its .bin files; LLaMA 3's shards are uint32.
  TempDir llama;
  write(llama.file("l_train_000000.bin"), shard(kLlmcLlama3Magic, 7, {128000, 9906, 128255, 70000, 5}, 4));
  write(llama.file("notes.txt"), "not a shard");
  auto l = open_tokens("tokens", llama.path(), {2});
  EXPECT_EQ(l.train->info().num_classes, 128256);
  EXPECT_FALSE(l.test);
  EXPECT_EQ(row(l.train->get_batch({1}, 0).inputs, 0), (std::vector<int64_t>{128255, 70000}));
}

// nanoGPT's prepare.py writes np.uint16 arrays with no header: train.bin
// and val.bin; the vocabulary comes from --vocab-size.
TEST(TokensTest, NanoGptBinsWrittenByNumpy) {
  TempDir dir;
  auto r = testing::run(std::string(TANDEM_PYTHON) + " -c \"import numpy as np; "
                        "np.array(list(range(100, 160)), dtype=np.uint16).tofile('" + dir.file("train.bin") + "'); "
                        "np.array([65, 66, 67, 68, 69], dtype=np.uint16).tofile('" + dir.file("val.bin") + "')\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(error_of([&] { open_tokens("tokens", dir.path(), {4}); }).find("give it with --vocab-size"),
            std::string::npos);
  auto splits = open_tokens("tokens", dir.path(), {4, /*vocab_size=*/200});
  EXPECT_EQ(splits.train->info().num_classes, 200);
  EXPECT_EQ(row(splits.train->get_batch({1}, 0).inputs, 0), (std::vector<int64_t>{104, 105, 106, 107}));
  EXPECT_EQ(row(splits.test->get_batch({0}, 0).targets, 0), (std::vector<int64_t>{66, 67, 68, 69}));
  const auto message = error_of([&] { open_tokens("tokens", dir.path(), {4, 150}); });
  EXPECT_NE(message.find(dir.file("train.bin") + ": token 50 is 150, outside the vocabulary of 150 (--vocab-size)"),
            std::string::npos) << message;
}

TEST(TokensTest, LyingOrDamagedFilesAreNamed) {
  TempDir dir;
  struct Case {
    std::string bytes, expected;
  };
  const std::vector<Case> cases = {
      {shard(kLlmcGpt2Magic, 1, {1, 2, 3}, 2, /*claimed=*/4),
       "the llm.c header says 4 tokens of 2 bytes (8 bytes), but 6 bytes follow it"},
      {shard(kLlmcGpt2Magic, 1, {1, 2, 3}, 2, /*claimed=*/-5), "negative token count"},
      {shard(kLlmcGpt2Magic, 3, {1, 2, 3}, 2), "with version 3; expected version 1"},
      {shard(kLlmcLlama3Magic, 7, {1, 2, 3}, 2), "the llm.c header says 3 tokens of 4 bytes"},
      {shard(kLlmcGpt2Magic, 1, {1, 2}, 2).substr(0, 100), "100 bytes, shorter than llm.c's header of 1024 bytes"},
      {std::string(7, 'x'), "are not a whole number of nanoGPT's uint16 tokens"},
      {shard(kLlmcGpt2Magic, 1, {1, 50257, 3}, 2), "token 1 is 50257, outside the vocabulary of 50257"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir.file("case" + std::to_string(i) + "_train.bin");
    write(path, cases[i].bytes);
    const auto message = error_of([&] { open_tokens("tokens", path, {1, 0}); });
    EXPECT_EQ(message.rfind(path + ": ", 0), 0u) << message;
    EXPECT_NE(message.find(cases[i].expected), std::string::npos) << i << ": " << message;
  }
  write(dir.file("a_train.bin"), shard(kLlmcGpt2Magic, 1, {1, 2, 3}, 2));
  write(dir.file("b_train.bin"), shard(kLlmcLlama3Magic, 7, {1, 2, 3}, 4));
  EXPECT_NE(error_of([&] { open_tokens("tokens", dir.file("a_train.bin") + "x", {1}); }).find("no such file"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              open_tokens("tokens", dir.file("[ab]_train.bin"), {1});
            }).find("llm.c llama-3 tokens, but " + dir.file("a_train.bin") + " holds llm.c gpt-2 tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open_tokens("tokens", dir.file("none*.bin"), {1}); }).find("no file matches"),
            std::string::npos);
  write(dir.file("only_val_0.bin"), shard(kLlmcGpt2Magic, 1, {1, 2, 3}, 2));
  EXPECT_NE(error_of([&] { open_tokens("tokens", dir.file("only_val_*.bin"), {1}); }).find("no training tokens"),
            std::string::npos);
  EXPECT_NE(error_of([&] { open_tokens("tokens", dir.path(), {0}); }).find("--seq-len: expected a positive"),
            std::string::npos);
}

TEST(TokensTest, ASplitShorterThanAWindowSaysWhatItNeeds) {
  TempDir dir;
  write(dir.file("t.txt"), std::string(100, 'x'));
  const auto message = error_of([&] { open_tokens("text", dir.file("t.txt"), {16}); });
  EXPECT_NE(message.find(": 100 bytes; its training part (90) and its held-out tail (10, a tenth) each need one "
                         "window of --seq-len 16 + 1 tokens"),
            std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::data
