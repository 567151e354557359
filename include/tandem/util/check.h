// tandem/util/check.h: the one error type and the TANDEM_CHECK macro.
//
// Library code never exits or asserts: it throws tandem::Error with a message
// that names the thing at fault (a file, a flag, a rank) and what was
// expected, on one line (details after "; "). The CLI prints it on stderr,
// control characters in names escaped (printable in tandem/util/file.h),
// and exits non-zero.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace tandem {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// A command line that cannot work whatever the data, files and machine: a
// flag's value out of range, flags that do not go together. The CLI exits 2
// for it (1 for every other Error), and checks what it can before any
// worker starts.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Runs `body` and returns what it returns; a tandem::Error it throws is
// thrown again as a UsageError with the same message: for code that cannot
// tell whether its input came from the command line, called where the
// caller knows that it did.
template <typename F>
auto as_usage_error(F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
}

namespace detail {
template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
}  // namespace detail

}  // namespace tandem

// TANDEM_CHECK(cond, parts...): throw tandem::Error(parts...) unless cond.
#define TANDEM_CHECK(cond, ...)                                  \
  do {                                                           \
    if (!(cond)) {                                               \
      throw ::tandem::Error(::tandem::detail::str_cat(__VA_ARGS__)); \
    }                                                            \
  } while (0)

// TANDEM_CHECK_USAGE(cond, parts...): throw tandem::UsageError(parts...) unless cond.
#define TANDEM_CHECK_USAGE(cond, ...)                                     \
  do {                                                                    \
    if (!(cond)) {                                                        \
      throw ::tandem::UsageError(::tandem::detail::str_cat(__VA_ARGS__)); \
    }                                                                     \
  } while (0)

// TANDEM_FAIL(parts...): throw unconditionally.
#define TANDEM_FAIL(...) throw ::tandem::Error(::tandem::detail::str_cat(__VA_ARGS__))
