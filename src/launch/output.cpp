// Copying the workers' output to the launcher's, a line at a time, each
// prefixed with its rank.
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "worker.h"

namespace tandem::launch::internal {
namespace {

// One line of rank `rank`'s output, prefixed, bytes as they are (a NUL
// included).
void write_line(std::FILE* to, int64_t rank, const char* data, size_t size) {
  std::fprintf(to, "[rank %lld] ", static_cast<long long>(rank));
  std::fwrite(data, 1, size, to);
  std::fputc('\n', to);
}

// A line longer than this goes out in pieces of this size, each prefixed:
// the launcher's memory stays bounded whatever a worker writes without a
// newline (a sweep's find: 300 MB without one took 53 s and 940 MB).
constexpr size_t kMaxLine = size_t{1} << 20;

// Copies complete lines from `s` to its destination with the rank prefix;
// at EOF also the last partial line. Returns false at EOF. Only the bytes
// just read are searched for a newline (what is pending has none).
}  // namespace

bool pump(Stream& s, int64_t rank, bool eof_flush) {
  char buffer[65536];
  ssize_t n = read(s.fd, buffer, sizeof buffer);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  bool eof = n <= 0;
  size_t start = 0, from = s.pending.size();
  if (n > 0) s.pending.append(buffer, static_cast<size_t>(n));
  for (size_t newline; (newline = s.pending.find('\n', from)) != std::string::npos; from = start) {
    for (; newline - start > kMaxLine; start += kMaxLine) write_line(s.to, rank, s.pending.data() + start, kMaxLine);
    write_line(s.to, rank, s.pending.data() + start, newline - start);
    start = newline + 1;
  }
  for (; s.pending.size() - start >= kMaxLine; start += kMaxLine) {
    write_line(s.to, rank, s.pending.data() + start, kMaxLine);
  }
  s.pending.erase(0, start);
  if ((eof || eof_flush) && !s.pending.empty()) {
    write_line(s.to, rank, s.pending.data(), s.pending.size());
    s.pending.clear();
  }
  std::fflush(s.to);
  if (eof) {
    close(s.fd);
    s.fd = -1;
  }
  return !eof;
}

}  // namespace tandem::launch::internal
