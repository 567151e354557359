#include "tandem/util/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "tandem/util/check.h"

namespace tandem {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISREG(mode)) return "a regular file";
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// "PATH: is KIND; expected EXPECTED", the path made printable.
[[noreturn]] void fail_kind(const std::string& path, const std::string& kind, const std::string& expected) {
  if (kind == "nothing") TANDEM_FAIL(printable(path), ": no such file (expected ", expected, ")");
  TANDEM_FAIL(printable(path), ": is ", kind, "; expected ", expected);
}

}  // namespace

std::string printable(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
          out += escaped;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string path_kind(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0) return kind_of(st.st_mode);
  const int why = errno;
  struct stat link {};
  if (::lstat(path.c_str(), &link) == 0 && S_ISLNK(link.st_mode)) return "a link to nothing";
  if (why == ENOENT || why == ENOTDIR) return "nothing";
  return std::string("unreadable (") + std::strerror(why) + ")";
}

void check_regular_file(const std::string& path, const std::string& expected) {
  const std::string kind = path_kind(path);
  if (kind != "a regular file") fail_kind(path, kind, expected);
}

std::string read_regular_file(const std::string& path, const std::string& expected) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    const int why = errno;
    const std::string kind = path_kind(path);
    if (kind != "a regular file") fail_kind(path, kind, expected);
    TANDEM_FAIL(printable(path), ": cannot open: ", std::strerror(why));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  TANDEM_CHECK(::fstat(fd, &st) == 0, printable(path), ": cannot read: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail_kind(path, kind_of(st.st_mode), expected);
  // Blocking again: a regular file never blocks, but some file systems
  // (FUSE) honour the flag.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n >= 0, printable(path), ": cannot read: ", std::strerror(errno));
    if (n == 0) break;  // shrank while read
    done += static_cast<size_t>(n);
  }
  bytes.resize(done);
  return bytes;
}

int open_lines_output(const std::string& flag, const std::string& path, bool append) {
  const std::string named = flag + (flag.empty() ? "" : " ") + printable(path);
  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;
  if (exists) {
    TANDEM_CHECK(!S_ISDIR(st.st_mode) && !S_ISBLK(st.st_mode), named, ": is ", kind_of(st.st_mode),
                 "; expected a file to write lines to");
    // This process's own stdout or stderr under another name: written
    // through that descriptor, whose file offset the lines then share (a
    // descriptor of its own would write where stdout's next text goes).
    for (int fd : {STDOUT_FILENO, STDERR_FILENO}) {
      struct stat mine {};
      if (::fstat(fd, &mine) == 0 && mine.st_dev == st.st_dev && mine.st_ino == st.st_ino) {
        const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
        TANDEM_CHECK(copy >= 0, named, ": cannot write to it: ", std::strerror(errno));
        return copy;
      }
    }
    if (!S_ISREG(st.st_mode)) append = true;
  }
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NONBLOCK | (append ? O_APPEND : O_TRUNC);
  const int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    const int why = errno;
    TANDEM_CHECK(why != ENXIO, named, ": is a FIFO that nothing reads; start its reader first, or name a file");
    TANDEM_FAIL(named, ": cannot open for writing: ", std::strerror(why));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // lines are written whole, waiting if need be
  return fd;
}

void write_all(int fd, const std::string& bytes, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    TANDEM_CHECK(n > 0, what, ": write failed: ", n < 0 ? std::strerror(errno) : "nothing was written");
    done += static_cast<size_t>(n);
  }
}

}  // namespace tandem
