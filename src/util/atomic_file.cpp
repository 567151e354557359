#include "tandem/util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/removed_on_signal.h"

namespace tandem {
namespace {

void sync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  TANDEM_CHECK(fd >= 0, path, ": cannot open to sync: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  TANDEM_CHECK(rc == 0, path, ": cannot sync to disk: ", std::strerror(err));
}

}  // namespace

std::string rank_output_path(const std::string& pattern, int64_t rank) {
  const auto field = pattern.find("{rank}");
  if (field == std::string::npos) return rank == 0 ? pattern : std::string();
  return std::string(pattern).replace(field, 6, std::to_string(rank));
}

void check_output_file(const std::string& flag, const std::string& path) {
  std::error_code ec;
  const std::string named = flag + " " + printable(path);
  TANDEM_CHECK(!std::filesystem::is_directory(path, ec), named, ": is a folder; expected a file name");
  // One that is there and writable (a file to replace, /dev/stdout) needs
  // no writable folder.
  if (std::filesystem::exists(path, ec) && ::access(path.c_str(), W_OK) == 0) return;
  auto folder = std::filesystem::path(path).parent_path();
  if (folder.empty()) folder = ".";
  TANDEM_CHECK(std::filesystem::is_directory(folder, ec) && ::access(folder.c_str(), W_OK) == 0, named,
               ": ", printable(folder.string()), " is not a folder this process can write to");
}

void check_replaceable_file(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto status = fs::status(path, ec);  // through a link: what it points to
  TANDEM_CHECK(!fs::exists(status) || fs::is_regular_file(status), flag, flag.empty() ? "" : " ", printable(path),
               ": is ", path_kind(path), ", not a regular file; this file is written whole and renamed into "
               "place, which would replace it: name a regular file");
}

void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write_to) {
  namespace fs = std::filesystem;
  check_replaceable_file("", path);
  // A link is followed: the file it points to is replaced, the link kept.
  std::error_code link_ec;
  fs::path target = fs::is_symlink(path, link_ec) ? fs::weakly_canonical(path, link_ec) : fs::path(path);
  if (link_ec) target = path;
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::string tmp = target.string() + ".tmp-" + std::to_string(::getpid());
  RemovedOnSignal removed_on_signal(tmp);  // Note [temporaries on signals]
  try {
    write_to(tmp);
    sync_path(tmp, /*directory=*/false);
    std::error_code ec;
    fs::rename(tmp, target, ec);
    TANDEM_CHECK(!ec, path, ": cannot rename the finished file into place: ", ec.message());
    sync_path(dir.string(), /*directory=*/true);
  } catch (const std::exception& e) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    std::string message = e.what();
    if (message.find(path) == std::string::npos) message = path + ": " + message;
    TANDEM_FAIL(message);
  }
}

void check_output_folder(const std::string& flag, const std::string& folder) {
  const std::string named = flag + " " + printable(folder);
  std::error_code ec;
  TANDEM_CHECK(!folder.empty(), flag, ": expected a folder, got an empty name");
  const std::string kind = path_kind(folder);
  TANDEM_CHECK(kind != "a link to nothing", named, ": is a link to nothing; expected a folder (or a name to make one)");
  if (std::filesystem::exists(folder, ec)) {
    TANDEM_CHECK(std::filesystem::is_directory(folder, ec), named, ": is ", path_kind(folder), "; expected a folder");
    TANDEM_CHECK(::access(folder.c_str(), W_OK | X_OK) == 0, named, ": a folder this process cannot write to");
    return;
  }
  // Made at the start of the run: the nearest folder that exists must let it.
  std::filesystem::path above = std::filesystem::absolute(folder, ec).parent_path();
  while (!above.empty() && !std::filesystem::exists(above, ec)) above = above.parent_path();
  TANDEM_CHECK(std::filesystem::is_directory(above, ec), named, ": cannot be made: ", printable(above.string()), " is ",
               path_kind(above.string()), ", not a folder");
  TANDEM_CHECK(::access(above.c_str(), W_OK | X_OK) == 0, named, ": cannot be made: ", printable(above.string()),
               " is not a folder this process can write to");
}

}  // namespace tandem
