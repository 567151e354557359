// A SentencePiece model through Debian's libsentencepiece (tokenizer.h).
#include <sentencepiece_processor.h>

#include "tandem/data/tokenizer.h"
#include "tandem/util/check.h"
#include "text_unicode.h"
#include "tokenizer_internal.h"

namespace tandem::data {
namespace {

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& path, const std::string& flag) : path_(path) {
    const auto status = processor_.Load(path);
    TANDEM_CHECK_USAGE(status.ok(), flag, " ", path, ": not a SentencePiece model (", status.ToString(), ")");
    const int bos = processor_.bos_id(), eos = processor_.eos_id();
    if (bos >= 0) {
      separator_ = bos;
    } else if (eos >= 0) {
      separator_ = eos;
    }
  }
  std::vector<int32_t> encode(std::string_view text, const std::string& what) const override {
    text::check_utf8(text, what);
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    TANDEM_CHECK(status.ok(), what, ": SentencePiece could not encode it (", status.ToString(), ")");
    return {ids.begin(), ids.end()};
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    const int n = processor_.GetPieceSize();
    for (const int32_t id : ids) {
      TANDEM_CHECK(id >= 0 && id < n, "token id ", id, " is outside ", path_, "'s vocabulary of ", n);
    }
    std::string out;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &out);
    TANDEM_CHECK(status.ok(), "SentencePiece could not decode the ids (", status.ToString(), ")");
    return out;
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<int32_t> document_separator() const override { return separator_; }
  std::string describe() const override {
    return "SentencePiece, " + std::to_string(processor_.GetPieceSize()) + " tokens (" + path_ + ")";
  }
  const std::string& path() const override { return path_; }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor processor_;
  std::optional<int32_t> separator_;
};

}  // namespace

namespace internal {
std::unique_ptr<Tokenizer> sentencepiece_tokenizer(const std::string& path, const std::string& flag) {
  return std::make_unique<SentencePieceTokenizer>(path, flag);
}
}  // namespace internal

}  // namespace tandem::data
