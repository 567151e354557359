// tandem/util/removed_on_signal.h: a temporary file that a terminating
// signal removes before it ends the process.
//
// Note [temporaries on signals]: write_atomically writes "<path>.tmp-<pid>"
// and renames it. A process ended by a signal in between (the launcher's
// SIGTERM when a peer failed, a user's Ctrl-C) used to leave that file,
// up to the size of the model, where nothing removed it. While a
// RemovedOnSignal lives, SIGINT, SIGTERM, SIGHUP and SIGQUIT first unlink
// its path, then end the process as they would have (the default action,
// raised again), so the exit status is the same. The handler is installed
// on first use, for each of those signals whose disposition is still the
// default: a program's own handler is left alone, and then nothing is
// removed. At most kSlots paths at once (more are not removed). SIGKILL
// cannot be caught: checkpoint temporaries of dead processes are removed by
// the next run (Checkpointer), other files are not.
#pragma once

#include <string>

namespace tandem {

class RemovedOnSignal {
 public:
  static constexpr int kSlots = 16;

  explicit RemovedOnSignal(const std::string& path);
  ~RemovedOnSignal();
  RemovedOnSignal(const RemovedOnSignal&) = delete;
  RemovedOnSignal& operator=(const RemovedOnSignal&) = delete;

 private:
  int slot_ = -1;  // -1: not registered (all slots taken, or the path too long)
};

}  // namespace tandem
