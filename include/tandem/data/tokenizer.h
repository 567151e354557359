// tandem/data/tokenizer.h: text to token ids and back, as the Hugging Face
// `tokenizers` and Google's `sentencepiece` packages do it, id for id.
//
//   tokenizer.json   Hugging Face's byte-level BPE (GPT-2, LLaMA 3, Qwen):
//                    an NFC or no normalizer; the ByteLevel pre-tokenizer
//                    (GPT-2's regex) or a Split by a regex then ByteLevel;
//                    the BPE model's merges by rank; added and special
//                    tokens; the ByteLevel decoder. Anything else in the
//                    file is refused, naming its key.
//   *.model          a SentencePiece model (LLaMA 2, Mistral), through
//                    Debian's libsentencepiece.
//
// Note [encode without specials]: encode() never adds tokens of its own (a
// BOS, a template's): it is `tokenizers`' encode(text,
// add_special_tokens=False) and sentencepiece's encode(text), llm.c's
// encode_ordinary. Special tokens written in the text (<|endoftext|>) are
// matched as such, as `tokenizers` matches its added tokens. Text must be
// UTF-8: invalid bytes are refused naming their offset, never guessed at.
// decode() returns bytes (a token may hold part of a character), joined as
// the decoder joins them; special tokens come back as their text.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Throws tandem::Error for text that is not UTF-8 (naming `what` and
  // the offset of the first bad byte).
  virtual std::vector<int32_t> encode(std::string_view text, const std::string& what = "the text") const = 0;
  // Throws tandem::Error for an id outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  // Ids run from 0 to vocab_size() - 1.
  virtual int64_t vocab_size() const = 0;
  // The token written before each document (llm.c's scripts: GPT-2's
  // <|endoftext|>, LLaMA 3's <|begin_of_text|>, SentencePiece's BOS);
  // nullopt when the tokenizer has none.
  virtual std::optional<int32_t> document_separator() const = 0;
  // "byte-level BPE, 50257 tokens (tokenizer.json)"
  virtual std::string describe() const = 0;
  // The file it was read from.
  virtual const std::string& path() const = 0;
};

// Reads `path`: a tokenizer.json (any *.json) or a SentencePiece model
// (any other file). Throws tandem::UsageError naming `flag`, the file and
// the key for a file it cannot read or does not understand.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& flag = "--tokenizer");

}  // namespace tandem::data
