// What the launch tests share: running commands, finding processes.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "testing.h"

namespace tandem::launch_test {

using testing::run;
using testing::run_tandem;
using testing::TempDir;

// How many processes have `marker` in their command line. The pattern's
// first letter in brackets keeps the shell running pgrep from matching.
inline int count_processes(const std::string& marker) {
  std::string pattern = "^[" + marker.substr(0, 1) + "]" + marker.substr(1);
  auto r = run("pgrep -f -c -- '" + pattern + "' || true");
  return std::atoi(r.output.c_str());
}

// The pid of the one process whose command line matches `pattern` (a regex),
// waiting up to 5 s for it to appear; 0 if none.
inline pid_t pid_of(const std::string& pattern) {
  for (int i = 0; i < 50; ++i) {
    auto r = run("pgrep -f -- '" + pattern + "' || true");
    if (!r.output.empty()) return std::atoi(r.output.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tandem::launch_test
