// Shared helpers for tandem's tests: temporary folders, small data sets in
// the real on-disk formats, and running the `tandem` binary.
#pragma once

#include <string>

#include <torch/torch.h>

namespace tandem::testing {

// A fresh folder under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes an IDX file of unsigned bytes (gzip-compressed when `gzip`).
void write_idx(const std::string& path, const torch::Tensor& data, bool gzip);

// A learnable 10-class data set in MNIST layout under `dir`: class k is a
// bright band at rows [2k+3, 2k+5) over noise. Returns the images of the
// training split.
torch::Tensor write_synthetic_idx(const std::string& dir, int64_t train_count,
                                  int64_t test_count, bool gzip = false);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing its output.
CommandResult run(const std::string& command_line);

// Runs the tandem binary with `args` (a shell-quoted string).
CommandResult run_tandem(const std::string& args);

// Reads a whole file.
std::string read_text(const std::string& path);

}  // namespace tandem::testing
