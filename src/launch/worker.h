// src/launch/worker.h: the launcher's record of each worker it started,
// shared by the files of launcher.cpp's job: copying the workers' output
// (output.cpp) and the verdict on an attempt that failed (verdict.cpp).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "tandem/launch/worker_error.h"

namespace tandem::launch::internal {

using Clock = std::chrono::steady_clock;

struct Stream {
  int fd = -1;
  std::string pending;  // a partial line
  std::FILE* to = nullptr;
};

struct Worker {
  int64_t local_rank = 0, rank = 0;
  pid_t pid = -1;
  bool exited = false;
  int status = 0;
  Clock::time_point exit_seen;         // when the launcher reaped it
  bool stopped = false;                // reaped after the launcher signalled the workers to stop
  std::optional<WorkerError> error;    // what it reported (Note [first failure])
  // What the process was doing when the launcher began to stop the
  // workers, read from /proc before any signal ("" when running as usual):
  // a rank that others named as not answering is judged by it.
  std::string state_at_stop;
  Stream out, err;
};

int64_t steady_ns(Clock::time_point t);
bool exited_ok(int status);
// "exited with code 1", "was killed by signal 9 (SIGKILL)".
std::string describe_status(int status);

// ---- output.cpp ----------------------------------------------------------
// Copies complete lines from `s` to its destination with the rank prefix;
// at EOF also the last partial line. Returns false at EOF.
bool pump(Stream& s, int64_t rank, bool eof_flush);

// ---- verdict.cpp (Note [first failure]) -----------------------------------
// A private folder for the workers' error files, removed with what is in
// it. Without one (no writable temporary folder) the workers get no
// TANDEM_ERROR_FILE and are judged by their exits alone.
class ErrorFolder {
 public:
  ErrorFolder();
  ~ErrorFolder();
  ErrorFolder(const ErrorFolder&) = delete;
  ErrorFolder& operator=(const ErrorFolder&) = delete;
  // Rank `rank`'s file ("" without a folder), removed if an earlier attempt left one.
  std::string file_for(int64_t rank) const;

 private:
  std::string path_;
};

// What process `pid` is doing, in words, when it is not running as usual:
// "stopped by SIGSTOP or a terminal's ^Z", "stopped by a debugger", "in
// uninterruptible sleep, waiting on a disk or the kernel"; "" otherwise.
std::string process_state(pid_t pid);

// Of the workers that failed before the launcher stopped the others
// (`stop_began`), the one whose error did not follow a peer's, earliest
// first; -1 if none failed.
int first_failure(const std::vector<Worker>& workers, const std::optional<Clock::time_point>& stop_began);

// Note [first failure], continued: the worker that `failed` named as not
// answering, where that failure followed a peer's and the named rank is
// one of these workers that did not fail of an error of its own; null
// otherwise.
const Worker* unanswering(const std::vector<Worker>& workers, const Worker& failed);

// The launcher's account of the attempt's failure: the rank that stopped
// answering when a failure that followed a peer's names one, else the rank
// that failed first, with its error's first line.
std::string failure_reason(const std::vector<Worker>& workers, int failed);

// Note [restart back-off]: with --max-restarts, a failure that is the same
// each time and comes soon after the start (a missing file, a flag that
// cannot work, a port held) would otherwise restart the job at once, as
// fast as it fails, until the restarts are spent, with nothing said but the
// same line again. The launcher compares each failure with the last (the
// reason without its pids and temporary names) and, when it repeats within
// kStartupWindow of its attempt's start, waits 1, 2, 4, ... s (at most
// kMaxBackoff) before the next restart and says that the failure is the
// same each time. A different failure, or one after a long run, restarts
// at once, as before.
inline constexpr std::chrono::seconds kStartupWindow{60};
inline constexpr std::chrono::seconds kMaxBackoff{30};

class RestartBackoff {
 public:
  // Records a failure (the launcher's reason) that ended an attempt of
  // `ran`; returns how long to wait before the next.
  std::chrono::milliseconds after(const std::string& reason, Clock::duration ran);
  // How many attempts in a row ended in this same failure, before the last.
  int64_t repeats() const { return repeats_; }
  // "the same failure as the N attempts before, each within 60 s of its
  // start: " (empty without repeats).
  std::string describe() const;

 private:
  std::string last_;
  int64_t repeats_ = 0;
};

// `reason` without what differs between attempts of the same failure: the
// rank and pid it starts with (the ranks fail alike), other pids, and the
// numbers of temporary names (checkpoint-N.pt.tmp-PID).
std::string failure_key(const std::string& reason);

}  // namespace tandem::launch::internal
