// tandem/observe/metrics.h: per-epoch results and their JSON-lines record.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::observe {

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
  // Rank 0's bytes per training step by layout dimension ("dp", "pp") and
  // collective (engine/step_traffic.h); empty in one process.
  std::map<std::string, std::map<std::string, double>> comm_bytes_per_step;
  // --count-memory: rank 0's peak live tensor bytes over the epoch's
  // training steps, evaluation not counted (engine::CountingAllocator);
  // 0: not counted.
  int64_t peak_memory_bytes = 0;
  // Language models (absent for images; the losses are nats per token):
  double tokens_per_second = 0.0;  // 0: not a language model
  double mfu = 0.0;                // model FLOPs utilisation, 0..1 (0: the device's peak unknown)
  bool text = false;               // text data: a token is a byte, so bits per byte = loss / ln 2
};

// A language model's figures derived from the loss in nats per token:
// perplexity e^loss, and for text (a byte a token) bits per byte.
double perplexity(double loss_nats);
double bits_per_byte(double loss_nats_per_byte);

// One JSON object on one line (no trailing newline).
std::string to_json_line(const EpochMetrics& metrics);

// The records of a --metrics-out file, in order. Throws tandem::Error naming
// the file (and the line) when it cannot be read or a line is not a record.
std::vector<EpochMetrics> read_metrics(const std::string& path);

// Writes one line per record, each whole, to a file it creates or empties
// when opened (open_lines_output in tandem/util/file.h: a pipe, a terminal
// or this process's own output by another name is appended to instead).
class MetricsWriter {
 public:
  MetricsWriter() = default;
  // `append`: keep the existing lines (a resumed run).
  MetricsWriter(const std::string& path, bool append);
  MetricsWriter(MetricsWriter&& other) noexcept;
  MetricsWriter& operator=(MetricsWriter&& other) noexcept;
  ~MetricsWriter();
  void write(const EpochMetrics& metrics);
  bool enabled() const { return fd_ >= 0; }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace tandem::observe
