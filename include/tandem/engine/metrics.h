// tandem/engine/metrics.h: per-epoch results and their JSON-lines record.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace tandem::engine {

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based, as printed
  int64_t step = 0;   // optimizer steps taken so far
  double train_loss = 0.0;
  double train_acc = 0.0;
  double test_loss = 0.0;
  double test_acc = 0.0;  // 0..1
  bool evaluated = true;  // false: no evaluation data (test_* written as null)
  double epoch_seconds = 0.0;
  double images_per_second = 0.0;
  double lr = 0.0;  // learning rate of the last step
  int64_t world_size = 1;
  bool partial = false;  // the epoch was cut short by --max-steps
};

// One JSON object on one line (no trailing newline).
std::string to_json_line(const EpochMetrics& metrics);

// The records of a --metrics-out file, in order. Throws tandem::Error naming
// the file (and the line) when it cannot be read or a line is not a record.
std::vector<EpochMetrics> read_metrics(const std::string& path);

// Appends lines to a file, flushed after each line; creates or truncates it
// when opened.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // `append`: keep the existing lines (a resumed run).
  MetricsWriter(const std::string& path, bool append);
  void write(const EpochMetrics& metrics);
  bool enabled() const { return out_.is_open(); }

 private:
  std::string path_;
  std::ofstream out_;
};

}  // namespace tandem::engine
