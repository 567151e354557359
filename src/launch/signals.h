// src/launch/signals.h: the signals the launcher handles while its
// workers run, and the self-pipe through which they reach its poll loops
// (launcher.cpp). Internal to src/launch.
#pragma once

#include <signal.h>

#include <map>

namespace tandem::launch::internal {

// The signals the launcher passes on to its workers, as torchrun does:
// SIGINT, SIGTERM, SIGHUP (the terminal or the ssh session gone) and
// SIGQUIT; with SIGCHLD, the ones it handles.
inline constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
inline constexpr int kHandledSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};

// Signals reach the poll loop through a self-pipe (the handler only writes
// one byte, which is async-signal-safe): [0] is polled, both are closed in
// a forked worker.
extern int g_signal_pipe[2];

bool is_stop_signal(int s);

// Installs the handlers for one run and puts the old ones back.
class SignalScope {
 public:
  SignalScope();
  ~SignalScope();
  SignalScope(const SignalScope&) = delete;
  SignalScope& operator=(const SignalScope&) = delete;

 private:
  std::map<int, struct sigaction> old_;
  sigset_t old_mask_;
};

// A stop signal (kStopSignals) among the bytes waiting in the signal pipe
// (the last one), 0 if none; the bytes are consumed (a SIGCHLD byte only
// wakes the watch loop, which polls every worker anyway).
int take_stop_signal();

}  // namespace tandem::launch::internal
