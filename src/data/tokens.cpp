#include "tandem/data/tokens.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <torch/torch.h>

#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::data {

namespace {

int32_t read_int32_le(const uint8_t* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24);
}

int64_t token_at(const uint8_t* p, int64_t width) {
  switch (width) {
    case 1: return p[0];
    case 2: return static_cast<int64_t>(p[0]) | static_cast<int64_t>(p[1]) << 8;
    default: return static_cast<int64_t>(static_cast<uint32_t>(read_int32_le(p)));
  }
}

// Above this many bytes a split's digest reads its first and last MiB and
// its length, not every byte (a start-up pass over billions of tokens).
constexpr int64_t kWholeDigestBytes = 256LL << 20;

}  // namespace

TokenLayout token_layout(const std::string& kind, const uint8_t* data, int64_t size, const std::string& name) {
  TokenLayout layout;
  if (kind == "text") {
    layout.count = size;
    layout.vocab_size = 256;
    layout.format = "text";
    return layout;
  }
  TANDEM_CHECK(kind == "tokens", "token data: unknown kind '", kind, "'");
  const int32_t magic = size >= 4 ? read_int32_le(data) : 0;
  if (magic == kLlmcGpt2Magic || magic == kLlmcLlama3Magic) {
    const bool gpt2 = magic == kLlmcGpt2Magic;
    TANDEM_CHECK(size >= kLlmcHeaderBytes, name, ": ", size, " bytes, shorter than llm.c's header of ",
                 kLlmcHeaderBytes, " bytes");
    const int32_t version = read_int32_le(data + 4), count = read_int32_le(data + 8);
    const int32_t want_version = gpt2 ? 1 : 7;
    TANDEM_CHECK(version == want_version, name, ": llm.c header of magic ", magic, " with version ", version,
                 "; expected version ", want_version);
    layout.offset = kLlmcHeaderBytes;
    layout.width = gpt2 ? 2 : 4;
    layout.vocab_size = gpt2 ? 50257 : 128256;
    layout.format = gpt2 ? "llm.c gpt-2" : "llm.c llama-3";
    TANDEM_CHECK(count >= 0, name, ": llm.c header gives a negative token count (", count, ")");
    const int64_t body = size - kLlmcHeaderBytes;
    TANDEM_CHECK(body == static_cast<int64_t>(count) * layout.width, name, ": the llm.c header says ", count,
                 " tokens of ", layout.width, " bytes (", static_cast<int64_t>(count) * layout.width,
                 " bytes), but ", body, " bytes follow it");
    layout.count = count;
    return layout;
  }
  TANDEM_CHECK(size % 2 == 0, name, ": no llm.c header (magic ", kLlmcGpt2Magic, " or ", kLlmcLlama3Magic,
               "), and its ", size, " bytes are not a whole number of nanoGPT's uint16 tokens");
  layout.width = 2;
  layout.count = size / 2;
  layout.format = "nanoGPT uint16";
  return layout;
}

// A mapped (or owned) file and where its tokens lie.
struct TokenStream::Piece {
  std::string name;
  const uint8_t* base = nullptr;  // the file's first byte
  size_t mapped = 0;              // bytes mapped (0: owned or empty)
  std::string owned;
  TokenLayout layout;
  int64_t start = 0;  // its first token's index in the stream

  const uint8_t* token(int64_t index) const { return base + layout.offset + index * layout.width; }
  ~Piece() {
    if (mapped > 0) ::munmap(const_cast<uint8_t*>(base), mapped);
  }
};

TokenStream::TokenStream(const std::string& kind, const std::vector<std::string>& paths, int64_t vocab_size) {
  TANDEM_CHECK(!paths.empty(), kind, ": no files");
  for (const auto& path : paths) {
    auto piece = std::make_unique<Piece>();
    piece->name = path;
    check_regular_file(path, "a token file");
    int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    TANDEM_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
    struct stat st {};
    const bool regular = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    if (!regular) {
      ::close(fd);
      TANDEM_CHECK(false, path, ": is ", path_kind(path), "; expected a token file");
    }
    if (st.st_size > 0) {
      void* p = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
      const int error = errno;
      ::close(fd);
      TANDEM_CHECK(p != MAP_FAILED, path, ": cannot map: ", std::strerror(error));
      piece->base = static_cast<const uint8_t*>(p);
      piece->mapped = static_cast<size_t>(st.st_size);
    } else {
      ::close(fd);
    }
    piece->layout = token_layout(kind, piece->base, st.st_size, path);
    pieces_.push_back(std::move(piece));
  }
  finish(vocab_size);
}

TokenStream::TokenStream(std::string bytes, const TokenLayout& layout, const std::string& name) {
  auto piece = std::make_unique<Piece>();
  piece->name = name;
  piece->owned = std::move(bytes);
  piece->base = reinterpret_cast<const uint8_t*>(piece->owned.data());
  piece->layout = layout;
  TANDEM_CHECK(layout.offset >= 0 && layout.count >= 0 &&
                   layout.offset + layout.count * layout.width <= static_cast<int64_t>(piece->owned.size()),
               name, ": the layout does not fit its bytes");
  pieces_.push_back(std::move(piece));
  finish(layout.vocab_size);
}

TokenStream::~TokenStream() = default;

void TokenStream::finish(int64_t vocab_size) {
  format_ = pieces_.front()->layout.format;
  for (const auto& piece : pieces_) {
    TANDEM_CHECK(piece->layout.format == format_, piece->name, ": ", piece->layout.format, " tokens, but ",
                 pieces_.front()->name, " holds ", format_, " tokens; one data set is of one format");
    piece->start = size_;
    size_ += piece->layout.count;
  }
  vocab_size_ = vocab_size > 0 ? vocab_size : pieces_.front()->layout.vocab_size;
  TANDEM_CHECK(vocab_size_ > 0, pieces_.front()->name, ": ", format_,
               " tokens say nothing of their vocabulary; give it with --vocab-size");
  // Every token in the vocabulary (a model's embedding has vocab_size rows).
  for (const auto& piece : pieces_) {
    const auto& l = piece->layout;
    if (l.width == 1 && vocab_size_ >= 256) continue;
    for (int64_t i = 0; i < l.count; ++i) {
      const int64_t t = token_at(piece->token(i), l.width);
      TANDEM_CHECK(t < vocab_size_, piece->name, ": token ", i, " is ", t, ", outside the vocabulary of ",
                   vocab_size_, vocab_size > 0 ? " (--vocab-size)" : "");
    }
  }
}

void TokenStream::read(int64_t start, int64_t count, int64_t* out) const {
  TANDEM_CHECK(start >= 0 && count >= 0 && start + count <= size_, "token stream: tokens [", start, ", ",
               start + count, ") are outside its ", size_);
  auto it = std::upper_bound(pieces_.begin(), pieces_.end(), start,
                             [](int64_t s, const std::unique_ptr<Piece>& p) { return s < p->start; });
  for (auto piece = it - 1; count > 0; ++piece) {
    const auto& p = **piece;
    const int64_t from = start - p.start, n = std::min(count, p.layout.count - from);
    for (int64_t i = 0; i < n; ++i) out[i] = token_at(p.token(from + i), p.layout.width);
    out += n;
    start += n;
    count -= n;
  }
}

uint32_t TokenStream::crc32(int64_t start, int64_t count) const {
  uLong crc = ::crc32(0L, Z_NULL, 0);
  for (const auto& piece : pieces_) {
    const auto& l = piece->layout;
    const int64_t from = std::max(start, piece->start), to = std::min(start + count, piece->start + l.count);
    for (int64_t at = from; at < to;) {  // zlib takes at most 4 GiB a call
      const int64_t n = std::min<int64_t>(to - at, (1LL << 30) / l.width);
      crc = ::crc32(crc, piece->token(at - piece->start), static_cast<uInt>(n * l.width));
      at += n;
    }
  }
  return static_cast<uint32_t>(crc);
}

std::string TokenStream::describe() const {
  return std::to_string(pieces_.size()) + (pieces_.size() == 1 ? " file, " : " files, ") + std::to_string(size_) +
         " tokens";
}

TokenDataset::TokenDataset(std::shared_ptr<const TokenStream> stream, int64_t first, int64_t count, int64_t seq_len,
                           std::string description)
    : stream_(std::move(stream)), first_(first), count_(count), seq_len_(seq_len),
      description_(std::move(description)) {
  TANDEM_CHECK(seq_len_ > 0, "--seq-len: expected a positive number of tokens, got ", seq_len_);
  TANDEM_CHECK(first_ >= 0 && count_ >= 0 && first_ + count_ <= stream_->size(), description_,
               ": tokens outside the stream");
  TANDEM_CHECK(count_ >= seq_len_ + 1, description_, ": ", count_, " tokens, fewer than one window of --seq-len ",
               seq_len_, " + 1");
  windows_ = (count_ - 1) / seq_len_;
}

DatasetInfo TokenDataset::info() const {
  DatasetInfo info;
  info.num_classes = stream_->vocab_size();
  info.seq_len = seq_len_;
  return info;
}

Batch TokenDataset::get_batch(const std::vector<int64_t>& indices, int64_t /*epoch*/) const {
  const auto b = static_cast<int64_t>(indices.size());
  auto window = torch::empty({b, seq_len_ + 1}, torch::kInt64);
  auto* out = window.data_ptr<int64_t>();
  for (int64_t i = 0; i < b; ++i) {
    const int64_t w = indices[i];
    TANDEM_CHECK(w >= 0 && w < windows_, description_, ": window ", w, " of ", windows_);
    stream_->read(first_ + w * seq_len_, seq_len_ + 1, out + i * (seq_len_ + 1));
  }
  using torch::indexing::Slice;
  return {window.index({Slice(), Slice(0, seq_len_)}).contiguous(),
          window.index({Slice(), Slice(1, torch::indexing::None)}).contiguous()};
}

std::string TokenDataset::describe() const {
  return description_ + " (" + std::to_string(count_) + " tokens, " + std::to_string(windows_) + " windows of " +
         std::to_string(seq_len_) + ")";
}

uint32_t TokenDataset::content_digest() const {
  const int64_t width_bytes = count_ * 4;  // an upper bound of the bytes read
  if (width_bytes <= kWholeDigestBytes) return stream_->crc32(first_, count_);
  const int64_t edge = (1LL << 20) / 4;
  uint32_t crc = stream_->crc32(first_, edge) ^ stream_->crc32(first_ + count_ - edge, edge);
  return static_cast<uint32_t>(::crc32(crc, reinterpret_cast<const Bytef*>(&count_), sizeof count_));
}

}  // namespace tandem::data
