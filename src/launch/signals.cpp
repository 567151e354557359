// The launcher's signal handling (signals.h).
#include "signals.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>

#include "tandem/util/check.h"

namespace tandem::launch::internal {

int g_signal_pipe[2] = {-1, -1};

namespace {

void on_signal(int signal_number) {
  int saved = errno;
  char byte = static_cast<char>(signal_number);
  ssize_t ignored = write(g_signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

}  // namespace

bool is_stop_signal(int s) {
  return std::find(std::begin(kStopSignals), std::end(kStopSignals), s) != std::end(kStopSignals);
}

SignalScope::SignalScope() {
  TANDEM_CHECK(pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "launch: pipe2 failed: ", std::strerror(errno));
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int s : kHandledSignals) sigaction(s, &action, &old_[s]);
  // A launcher started with these blocked (the mask survives exec) would
  // never hear them; one that arrived before now is delivered here.
  sigset_t ours;
  sigemptyset(&ours);
  for (int s : kHandledSignals) sigaddset(&ours, s);
  sigprocmask(SIG_UNBLOCK, &ours, &old_mask_);
}

SignalScope::~SignalScope() {
  sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
  for (auto& [s, old] : old_) sigaction(s, &old, nullptr);
  close(g_signal_pipe[0]);
  close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

int take_stop_signal() {
  int seen = 0;
  char bytes[64];
  ssize_t n;
  while ((n = read(g_signal_pipe[0], bytes, sizeof bytes)) > 0) {
    for (ssize_t k = 0; k < n; ++k) {
      if (is_stop_signal(bytes[k])) seen = bytes[k];
    }
  }
  return seen;
}

}  // namespace tandem::launch::internal
