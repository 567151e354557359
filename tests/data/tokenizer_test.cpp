// tandem's tokenizers against the packages themselves: byte-level BPEs
// trained by `tokenizers` (GPT-2's pre-tokenizer; LLaMA 3's regex with NFC
// and ignore_merges) and SentencePiece models trained by `sentencepiece`
// (BPE and unigram), by tests/data/tokenizer_reference.py, on a text of
// this repository's documentation; then texts none of them saw (English,
// accented, CJK, emoji, whitespace runs, digits, special tokens written in
// the text) encoded and decoded by both, id for id and byte for byte.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tandem/data/tokenizer.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem {
namespace {

using nlohmann::json;

// UTF-8 of a code point.
std::string utf8(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

// Seeded random strings over the characters where tokenizers differ most:
// Unicode's many spaces, combining marks, digits and letters of other
// scripts, apostrophes before letters, CR/LF runs, emoji and joiners.
std::vector<std::string> random_cases(int count) {
  static const std::vector<uint32_t> pool = {
      ' ', ' ', ' ', 'a', 'b', 'Z', 'e', 't', 's', '\'', '\'', '\n', '\r', '\t', '0', '7', '.', ',', '!', '-', '<',
      '>', '|', 0xA0, 0x1680, 0x2000, 0x2009, 0x200B, 0x2028, 0x3000, 0x180E, 0xFEFF, 0x85, 0x0301, 0x0308,
      0x0663, 0x0967, 0xFF11, 0x00E9, 0x00DF, 0x0130, 0x03A3, 0x0416, 0x05D0, 0x0627, 0x0E01, 0x4E2D, 0x3042,
      0xAC00, 0x1F600, 0x1F44D, 0x1F3FD, 0x200D, 0x2764, 0xFE0F, 0x00AD, 0x2019, 0x00B2, 0x2163, 0x1D400};
  uint64_t state = 88172645463325252ull;
  auto next = [&] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) {
    std::string text;
    const int length = 1 + int(next() % 40);
    for (int k = 0; k < length; ++k) text += utf8(pool[next() % pool.size()]);
    out.push_back(text);
  }
  return out;
}

const std::vector<std::string>& cases() {
  static const std::vector<std::string> c = [] {
    std::vector<std::string> fixed = {
      "Hello, world! It's a test: we'll see what they've done.",
      "  leading spaces, trailing spaces   \n\n\tand tabs\t\t",
      "Numbers 1234567 and 3.14159, 2026-11-30; x=42*y",
      "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00c5ngstr\u00f6m",
      // NFD: an e and a combining acute accent (NFC makes them one).
      "Cafe\u0301 re\u0301sume\u0301",
      "\u6771\u4eac\u3067\u6a5f\u68b0\u5b66\u7fd2\u3092\u5b66\u3076\u3002\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5",
      "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc640 emoji \U0001F600\U0001F680 \U0001F469\u200d\U0001F4BB!",
      "<|endoftext|>two documents<|endoftext|> joined",
      "<|begin_of_text|>Llama's<|end_of_text|>",
      "CAPITAL'S AND 'LL 'VE\r\nWindows line\r\n",
      "",
      " ",
      "a",
    };
    // Long pieces that merge again and again (a merge scan per merge took
    // minutes on these: Note in bpe_tokenizer.cpp's merge_all).
    fixed.push_back(std::string(1 << 18, ' ') + "x");
    fixed.push_back(std::string(100000, '=') + " end");
    const auto random = random_cases(400);
    fixed.insert(fixed.end(), random.begin(), random.end());
    return fixed;
  }();
  return c;
}

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

// The reference files, made once for the whole test program.
struct Reference {
  testing::TempDir dir;
  json expected;
  std::string error;
};

const Reference& reference() {
  static Reference* ref = [] {
    auto* r = new Reference;
    // The training text: this repository's documentation.
    {
      std::ofstream train(r->dir.file("train.txt"), std::ios::binary);
      for (const auto& entry : std::filesystem::directory_iterator(std::string(TANDEM_SOURCE_DIR) + "/docs")) {
        if (entry.path().extension() == ".md") train << testing::read_text(entry.path().string());
      }
    }
    std::ofstream(r->dir.file("cases.json")) << json(cases()).dump();
    auto result = testing::run(std::string(TANDEM_PYTHON) + " " + TANDEM_SOURCE_DIR +
                               "/tests/data/tokenizer_reference.py " + r->dir.file("train.txt") + " " +
                               r->dir.file("cases.json") + " " + r->dir.path() + " 2>&1");
    if (result.exit_code != 0) {
      r->error = result.output;
      return r;
    }
    r->expected = json::parse(testing::read_text(r->dir.file("expected.json")));
    return r;
  }();
  return *ref;
}

class TokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(TokenizerTest, EncodesAndDecodesAsThePackageDoes) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const auto tokenizer = data::load_tokenizer(ref.dir.file(GetParam()));
  const auto& expected = ref.expected.at(GetParam());
  ASSERT_EQ(expected.size(), cases().size());
  int64_t tokens = 0;
  for (size_t i = 0; i < cases().size(); ++i) {
    const auto ids = tokenizer->encode(cases()[i]);
    const auto want = expected[i]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(ids, want) << GetParam() << ", case " << i << ": \"" << cases()[i].substr(0, 200) << "\"";
    EXPECT_EQ(hex(tokenizer->decode(want)), expected[i]["decoded"].get<std::string>())
        << GetParam() << ", case " << i;
    tokens += static_cast<int64_t>(ids.size());
  }
  EXPECT_GT(tokens, 100);  // the cases are not trivially empty
}

INSTANTIATE_TEST_SUITE_P(Files, TokenizerTest,
                         ::testing::Values("gpt2.json", "llama3.json", "sp_bpe.model", "sp_unigram.model"),
                         [](const auto& info) {
                           auto name = info.param;
                           for (auto& c : name) {
                             if (c == '.') c = '_';
                           }
                           return name;
                         });

TEST(TokenizerFileTest, TheMergesRanksDecideTheTokens) {
  // Control: the same vocabulary with its merges reversed must encode the
  // cases otherwise (the comparison above can fail).
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  auto spec = json::parse(testing::read_text(ref.dir.file("gpt2.json")));
  auto& merges = spec["model"]["merges"];
  std::reverse(merges.begin(), merges.end());
  std::ofstream(ref.dir.file("reversed.json")) << spec.dump();
  const auto reversed = data::load_tokenizer(ref.dir.file("reversed.json"));
  const auto original = data::load_tokenizer(ref.dir.file("gpt2.json"));
  int differ = 0;
  for (const auto& text : cases()) differ += reversed->encode(text) != original->encode(text);
  EXPECT_GE(differ, 5);
}

TEST(TokenizerFileTest, InvalidUtf8IsNamedWithItsOffset) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  for (const char* file : {"gpt2.json", "sp_bpe.model"}) {
    const auto tokenizer = data::load_tokenizer(ref.dir.file(file));
    const std::string bad = std::string("valid text, then ") + "\xC3\x28" + " more";
    const auto message = testing::error_of([&] { tokenizer->encode(bad, "doc.txt"); });
    EXPECT_NE(message.find("doc.txt is not UTF-8: byte offset 17"), std::string::npos) << message;
    const auto truncated = testing::error_of([&] { tokenizer->encode("ends in \xE6\x97", "doc.txt"); });
    EXPECT_NE(truncated.find("byte offset 8"), std::string::npos) << truncated;
  }
}

TEST(TokenizerFileTest, AnotherModelTypeOrABrokenFileIsRefusedNamingTheKey) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  auto refusal = [](const std::string& path) {
    try {
      data::load_tokenizer(path);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(no refusal)");
  };
  const auto wordpiece = refusal(ref.dir.file("wordpiece.json"));
  EXPECT_NE(wordpiece.find("wordpiece.json: model.type \"WordPiece\""), std::string::npos) << wordpiece;

  auto spec = json::parse(testing::read_text(ref.dir.file("gpt2.json")));
  spec["model"]["surprise"] = 1;
  std::ofstream(ref.dir.file("unknown_key.json")) << spec.dump();
  EXPECT_NE(refusal(ref.dir.file("unknown_key.json")).find("unknown key \"model.surprise\""), std::string::npos);

  spec = json::parse(testing::read_text(ref.dir.file("gpt2.json")));
  spec["normalizer"] = {{"type", "Lowercase"}};
  std::ofstream(ref.dir.file("lowercase.json")) << spec.dump();
  EXPECT_NE(refusal(ref.dir.file("lowercase.json")).find("normalizer.type \"Lowercase\""), std::string::npos);

  std::ofstream(ref.dir.file("truncated.json")) << testing::read_text(ref.dir.file("gpt2.json")).substr(0, 500);
  EXPECT_NE(refusal(ref.dir.file("truncated.json")).find("truncated.json: not JSON"), std::string::npos);

  std::ofstream(ref.dir.file("junk.model")) << "not a protobuf at all";
  EXPECT_NE(refusal(ref.dir.file("junk.model")).find("junk.model: not a SentencePiece model"), std::string::npos);
  EXPECT_NE(refusal(ref.dir.file("absent.json")).find("absent.json: no such file"), std::string::npos);
}

TEST(TokenizerFileTest, TheDocumentSeparatorIsTheModelsOwn) {
  const auto& ref = reference();
  ASSERT_TRUE(ref.error.empty()) << ref.error;
  const auto gpt2 = data::load_tokenizer(ref.dir.file("gpt2.json"));
  ASSERT_TRUE(gpt2->document_separator().has_value());
  EXPECT_EQ(gpt2->decode({*gpt2->document_separator()}), "<|endoftext|>");
  const auto llama3 = data::load_tokenizer(ref.dir.file("llama3.json"));
  EXPECT_EQ(llama3->decode({*llama3->document_separator()}), "<|begin_of_text|>");
  const auto sp = data::load_tokenizer(ref.dir.file("sp_bpe.model"));
  EXPECT_EQ(sp->document_separator(), 1);  // sentencepiece's <s>
}

}  // namespace
}  // namespace tandem
