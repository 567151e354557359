// tandem/util/progress.h: live progress for long loops.
//
// On a terminal: one line redrawn in place with a bar, rate and ETA. Elsewhere
// (a pipe, a CI log): a plain line at most every `line_interval` seconds and
// one at the end, so logs stay short and readable.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

#include "tandem/util/stopwatch.h"

namespace tandem {

struct ProgressOptions {
  std::string label;            // e.g. "epoch 1/5"
  int64_t total = 0;            // number of steps
  std::string unit = "img";     // what update()'s `items` counts
  bool live = false;            // redraw in place (true on a terminal)
  double line_interval = 10.0;  // seconds between plain lines
  std::FILE* out = stderr;
};

class Progress {
 public:
  explicit Progress(ProgressOptions options);
  // `done` of `total` steps finished, `items` processed so far; `status` is
  // appended (e.g. "loss 0.4312").
  void update(int64_t done, int64_t items, const std::string& status);
  // Stops the clock: rate and time in later lines cover the work up to now
  // (call it before evaluation, say).
  void freeze();
  // The final line (always printed): `done` steps, `items` processed.
  void finish(int64_t done, int64_t items, const std::string& status);

 private:
  std::string line(int64_t done, int64_t items, const std::string& status, bool bar) const;

  ProgressOptions options_;
  Stopwatch clock_;
  double last_print_ = -1.0;
  double frozen_ = -1.0;  // elapsed seconds at freeze(), or -1
};

// True when the stream is a terminal.
bool is_terminal(std::FILE* stream);

// "1:05", "1:02:03"
std::string format_duration(double seconds);

}  // namespace tandem
