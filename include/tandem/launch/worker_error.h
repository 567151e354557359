// tandem/launch/worker_error.h: how a failing worker tells its launcher why,
// so that the launcher can name the rank that failed first.
//
// Note [first failure]: when one rank of a job fails, the others usually
// fail too, a moment later, because their collectives lose that peer. The
// launcher sees exits in whatever order the processes end, and the rank
// whose own error started it all is often not the first to exit: it may
// still be unwinding (closing its files, its loader threads) while a peer
// has already printed "all_reduce ... failed: Connection reset" and gone.
// So the launcher gives each worker a file to write on failure
// (TANDEM_ERROR_FILE, one per rank, in a private folder of the launcher's),
// as torchrun does with TORCHELASTIC_ERROR_FILE. `tandem` writes it when
// it exits non-zero: when it failed (steady clock, the same on every process
// of one host), whether the error came through a collective or the store
// (`follows_peer`: the ranks that lost a peer), which ranks it found not
// answering, and the message. The launcher blames the failure that did not
// follow a peer, earliest first; when the first exit it sees followed a
// peer, it waits up to kPeerFailureWait for a worker with an error of its
// own before it stops the others. If none comes and the failure names a
// rank that did not answer (one frozen by SIGSTOP, stuck in the kernel, or
// busy elsewhere), that rank is named as the cause, with what its process
// was doing, rather than the rank that waited for it. Any program can write the file (format in docs/DISTRIBUTED.md);
// a worker that writes none is judged by its exit alone, as before.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::launch {

inline constexpr const char* kErrorFileVariable = "TANDEM_ERROR_FILE";

// Note [torchelastic error file]: under torchrun each worker is given
// TORCHELASTIC_ERROR_FILE; a worker that fails writes there what PyTorch's
// ErrorHandler would, {"message": {"message", "extraInfo": {"py_callstack",
// "timestamp": unix seconds}}} with tandem's message as both texts, and
// torchrun's summary names the failure with the earliest timestamp as the
// root cause (ties: the lowest rank). Its clock counts whole seconds, so a
// failure that followed a peer (a collective or the store that lost it)
// is stamped with the next second: the rank that failed of its own is then
// the one torchrun names, rather than a lower rank that only lost it.
inline constexpr const char* kTorchelasticErrorFileVariable = "TORCHELASTIC_ERROR_FILE";

// How long the launcher waits, after a first failure that followed a peer,
// for the failure it followed.
inline constexpr std::chrono::milliseconds kPeerFailureWait{3000};

struct WorkerError {
  int64_t time_ns = 0;        // steady_clock, when the worker reported it
  bool follows_peer = false;  // it came through a collective or the store
  // The ranks it found not answering (a collective's missing ranks, rank 0
  // when the store it serves went silent): the launcher names such a rank
  // as the cause when it did not fail of its own.
  std::vector<int64_t> unanswered;
  std::string message;
};

// The file's text for `error` and back; parse returns nullopt for anything
// that is not such a file (a worker may have died half way through writing
// it, or written something else there).
std::string format_worker_error(const WorkerError& error);
std::optional<WorkerError> parse_worker_error(const std::string& text);

// torchrun's error file for `message` (Note [torchelastic error file]).
std::string torchelastic_error_json(const std::string& message, bool follows_peer, int64_t unix_seconds);

// Where TANDEM_ERROR_FILE is set: writes `message` there (to a temporary
// name, then renamed, so the launcher never reads half a file); likewise
// torchrun's file where TORCHELASTIC_ERROR_FILE is set. Best effort: never
// throws, since it runs while the process is already failing.
void report_worker_error(const std::string& message, bool follows_peer,
                         const std::vector<int64_t>& unanswered = {});

// The error a worker left at `path`, if any.
std::optional<WorkerError> read_worker_error(const std::string& path);

}  // namespace tandem::launch
