// A split's shards through one spill file (token_shard_writer.h, Note [one spill file]).
#include "token_shard_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tandem/data/tokens.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::data::internal {
namespace {

void write_bytes(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, "cannot write ", path, " (", std::strerror(errno), ")");
    p += n;
    size -= static_cast<size_t>(n);
  }
}

}  // namespace

TokenShardWriter::TokenShardWriter(std::string out, std::string split, int64_t shard_tokens, bool wide)
    : out_(std::move(out)), split_(std::move(split)), shard_tokens_(shard_tokens), wide_(wide) {
  spill_ = (std::filesystem::path(out_) / ("tokens_" + split_ + ".tmp-" + std::to_string(getpid()))).string();
  guard_ = std::make_unique<RemovedOnSignal>(spill_);
  fd_ = ::open(spill_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd_ >= 0, "cannot write ", spill_, " (", std::strerror(errno), ")");
}

TokenShardWriter::~TokenShardWriter() {
  if (fd_ >= 0) ::close(fd_);
  std::remove(spill_.c_str());
}

void TokenShardWriter::add(const std::vector<int32_t>& tokens) {
  if (wide_) {
    std::vector<uint32_t> wide(tokens.begin(), tokens.end());
    write_bytes(fd_, wide.data(), wide.size() * 4, spill_);
  } else {
    std::vector<uint16_t> narrow(tokens.begin(), tokens.end());
    write_bytes(fd_, narrow.data(), narrow.size() * 2, spill_);
  }
  count_ += static_cast<int64_t>(tokens.size());
}

std::vector<std::string> TokenShardWriter::commit() {
  std::vector<std::string> shards;
  const int64_t width = wide_ ? 4 : 2;
  std::vector<char> buffer(size_t(1) << 20);
  for (int64_t start = 0, index = 0; start < count_; start += shard_tokens_, ++index) {
    const int64_t n = std::min(shard_tokens_, count_ - start);
    char name[64];
    std::snprintf(name, sizeof(name), "tokens_%s_%06lld.bin", split_.c_str(), static_cast<long long>(index));
    const auto path = (std::filesystem::path(out_) / name).string();
    const auto tmp = path + ".tmp-" + std::to_string(getpid());
    {
      RemovedOnSignal guard(tmp);
      const int out = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      TANDEM_CHECK(out >= 0, "cannot write ", tmp, " (", std::strerror(errno), ")");
      std::vector<int32_t> header(256, 0);
      header[0] = wide_ ? kLlmcLlama3Magic : kLlmcGpt2Magic;
      header[1] = wide_ ? 7 : 1;
      header[2] = static_cast<int32_t>(n);
      try {
        write_bytes(out, header.data(), kLlmcHeaderBytes, tmp);
        for (int64_t done = 0; done < n * width;) {
          const auto chunk = static_cast<size_t>(std::min<int64_t>(int64_t(buffer.size()), n * width - done));
          const ssize_t got = ::pread(fd_, buffer.data(), chunk, static_cast<off_t>(start * width + done));
          TANDEM_CHECK(got > 0, "cannot read ", spill_, " back (", std::strerror(errno), ")");
          write_bytes(out, buffer.data(), static_cast<size_t>(got), tmp);
          done += got;
        }
      } catch (...) {
        ::close(out);
        std::remove(tmp.c_str());
        throw;
      }
      TANDEM_CHECK(::close(out) == 0, "cannot write ", tmp, " (", std::strerror(errno), ")");
      std::filesystem::rename(tmp, path);
    }
    shards.push_back(path);
  }
  ::close(fd_);
  fd_ = -1;
  std::remove(spill_.c_str());
  return shards;
}

}  // namespace tandem::data::internal
