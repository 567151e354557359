// bench/bench_main.h: the frame every bench program's main() shares.
#pragma once

#include <cstdio>
#include <exception>
#include <functional>
#include <string>

#include "tandem/cli/flags.h"

namespace tandem::bench {

// Parses the command line into `flags`, prints --help when asked, else runs
// `body`. An exception becomes "NAME: error: <its first line>" on stderr and
// exit status 1.
inline int run(const char* name, cli::FlagSet& flags, int argc, char** argv,
               const std::function<void()>& body) {
  try {
    flags.parse({argv + 1, argv + argc});
    if (flags.help_requested()) {
      std::printf("%s", flags.help().c_str());
      return 0;
    }
    body();
  } catch (const std::exception& e) {
    std::string what = e.what();
    std::fprintf(stderr, "%s: error: %s\n", name, what.substr(0, what.find('\n')).c_str());
    return 1;
  }
  return 0;
}

}  // namespace tandem::bench
