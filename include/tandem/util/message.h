// tandem/util/message.h: an exception's message without libtorch's stack
// trace (for the layers that link libtorch; util itself does not).
#pragma once

#include <exception>
#include <string>

#include <c10/util/Exception.h>

namespace tandem {

// The message of `e` without libtorch's stack trace: c10::Error's what()
// appends one ("Exception raised from ... frame #0 ..."), which is noise in a
// message that names the thing at fault. For any other exception, what().
// Use it wherever a caught exception's message becomes part of another.
inline std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

}  // namespace tandem
