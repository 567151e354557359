// tandem/observe/tensorboard.h: scalars in TensorBoard's event files.
//
// An event file is a sequence of records, each a length, the masked CRC-32C
// of the length, the bytes of one Event message (TensorBoard's event.proto)
// and their masked CRC-32C. tandem writes the few fields it needs itself:
// an Event's wall_time (1, double), step (2, int64), file_version (3),
// summary (5) and session_log (7); a Summary's values (1), each a tag (1)
// and a simple_value (2, float). TensorBoard's own reader is the test
// (TensorBoardCliTest): it checks both checksums and parses every field.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::observe {

using Scalars = std::vector<std::pair<std::string, double>>;  // tag, value

// CRC-32C (Castagnoli), as the record format checks it; `crc` continues
// an earlier call's result.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// One record of an event file around `payload` (a serialized Event).
std::string event_record(const std::string& payload);

// Serialized Events: the file's first (its version), one holding scalars
// (written as float, as TensorBoard keeps them), and a session start at
// `step`: TensorBoard then drops what earlier files recorded at `step` and
// after (steps a run took after its last checkpoint, before it stopped).
std::string version_event(double wall_time);
std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars);
std::string session_start_event(double wall_time, int64_t step);

// Writes a new event file, events.out.tfevents.<seconds>.<host>.<pid>.tandem,
// in a folder (made if missing); TensorBoard reads every such file there.
// Each record is written whole as it comes, so a run that stops loses
// nothing it recorded.
class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // `resumed_at` >= 0: the run continues from a checkpoint of that step;
  // what earlier files hold after it is dropped (a session start). A fresh
  // run (-1) into a folder holding event files drops all of theirs.
  TensorBoardWriter(const std::string& folder, int64_t resumed_at);
  TensorBoardWriter(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;
  ~TensorBoardWriter();

  void write(int64_t step, const Scalars& scalars);
  bool enabled() const { return fd_ >= 0; }
  const std::string& path() const { return path_; }
  // Event files the folder held before this one (another run's, or this
  // run's before a resume).
  int64_t earlier_files() const { return earlier_files_; }

 private:
  void append(const std::string& payload);
  std::string path_;
  int fd_ = -1;
  int64_t earlier_files_ = 0;
};

}  // namespace tandem::observe
