#include "tandem/util/removed_on_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>

namespace tandem {
namespace {

constexpr size_t kPathBytes = 4096;
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};

// The handler reads these: a slot's path is written before its flag is set
// and left alone until the flag is cleared.
struct Slot {
  std::atomic<bool> used{false};
  char path[kPathBytes];
};
Slot slots[RemovedOnSignal::kSlots];
std::mutex slots_mutex;  // between registering threads, never in the handler

void remove_and_end(int signal) {
  const int saved = errno;
  for (auto& slot : slots) {
    if (slot.used.load(std::memory_order_acquire)) ::unlink(slot.path);  // async-signal-safe
  }
  errno = saved;
  ::signal(signal, SIG_DFL);
  ::raise(signal);  // the default action: the process ends as the signal says
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int signal : kSignals) {
      struct sigaction current {};
      if (::sigaction(signal, nullptr, &current) != 0 || current.sa_handler != SIG_DFL) continue;
      struct sigaction action {};
      action.sa_handler = remove_and_end;
      sigemptyset(&action.sa_mask);
      for (int other : kSignals) sigaddset(&action.sa_mask, other);  // one cleanup at a time
      ::sigaction(signal, &action, nullptr);
    }
  });
}

}  // namespace

RemovedOnSignal::RemovedOnSignal(const std::string& path) {
  if (path.size() >= kPathBytes) return;
  install_once();
  std::lock_guard<std::mutex> lock(slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (slots[i].used.load(std::memory_order_relaxed)) continue;
    std::memcpy(slots[i].path, path.c_str(), path.size() + 1);
    slots[i].used.store(true, std::memory_order_release);
    slot_ = i;
    return;
  }
}

RemovedOnSignal::~RemovedOnSignal() {
  if (slot_ < 0) return;
  std::lock_guard<std::mutex> lock(slots_mutex);
  slots[slot_].used.store(false, std::memory_order_release);
}

}  // namespace tandem
