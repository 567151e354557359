// fuzz/fuzz_common.h: what every libFuzzer target of tandem shares.
//
// Each target feeds bytes to one of tandem's readers of untrusted input and
// accepts exactly two outcomes: a result, or a tandem::Error (a clear
// message). Anything else (a crash, a sanitizer report, another exception
// type escaping) is a finding. Path-based readers get the bytes through a
// file in /dev/shm. LLVMFuzzerInitialize writes the target's seed inputs,
// made with tandem's own writers, into $TANDEM_FUZZ_SEEDS when set
// (fuzz/run.sh sets it to the corpus folder).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "tandem/util/check.h"

namespace tandem::fuzz {

// A file of this process that holds the current input.
inline const std::string& input_path(const char* suffix = ".bin") {
  static const std::string path =
      "/dev/shm/tandem-fuzz-" + std::to_string(::getpid()) + suffix;
  return path;
}

inline void write_bytes(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

// The seed folder, or "" when seeds are not wanted.
inline std::string seed_dir() {
  const char* dir = std::getenv("TANDEM_FUZZ_SEEDS");
  return dir == nullptr ? std::string() : std::string(dir);
}

// Runs `read`; a tandem::Error is an accepted outcome.
template <typename F>
int expect_result_or_error(F&& read) {
  try {
    read();
  } catch (const Error&) {
  }
  return 0;
}

}  // namespace tandem::fuzz
