// Note [first failure]: which worker's failure is the job's, and the
// launcher's account of it.
#include <sys/wait.h>

#include <cstdio>
#include <cstring>  // sigabbrev_np
#include <cstdlib>  // mkdtemp
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "tandem/util/env.h"
#include "tandem/util/table.h"
#include "worker.h"

namespace tandem::launch::internal {

int64_t steady_ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

bool exited_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

std::string describe_status(int status) {
  if (WIFEXITED(status)) return format("exited with code %d", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int s = WTERMSIG(status);
    const char* name = sigabbrev_np(s);
    return format("was killed by signal %d (SIG%s)", s, name ? name : "?");
  }
  return format("ended with status %d", status);
}

ErrorFolder::ErrorFolder() {
  const auto tmp = env::get("TMPDIR");
  std::string pattern = (tmp && !tmp->empty() ? *tmp : std::string("/tmp")) + "/tandem-launch-XXXXXX";
  if (mkdtemp(pattern.data()) != nullptr) path_ = pattern;
}

ErrorFolder::~ErrorFolder() {
  if (path_.empty()) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string ErrorFolder::file_for(int64_t rank) const {
  if (path_.empty()) return "";
  std::string file = path_ + "/rank-" + std::to_string(rank);
  std::remove(file.c_str());
  return file;
}

std::string process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto paren = text.rfind(')');  // the command name may hold spaces and parentheses
  if (paren == std::string::npos || paren + 2 >= text.size()) return "";
  switch (text[paren + 2]) {
    case 'T': return "stopped by SIGSTOP or a terminal's ^Z";
    case 't': return "stopped by a debugger";
    case 'D': return "in uninterruptible sleep, waiting on a disk or the kernel";
    default: return "";
  }
}

int first_failure(const std::vector<Worker>& workers, const std::optional<Clock::time_point>& stop_began) {
  int best = -1;
  std::pair<bool, int64_t> best_key{};
  for (size_t i = 0; i < workers.size(); ++i) {
    const Worker& w = workers[i];
    if (!w.exited || exited_ok(w.status)) continue;
    const bool reported = w.error && (!stop_began || w.error->time_ns <= steady_ns(*stop_began));
    if (!reported && stop_began && w.exit_seen > *stop_began) continue;  // one the launcher stopped
    const std::pair<bool, int64_t> key{reported && w.error->follows_peer,
                                       reported ? w.error->time_ns : steady_ns(w.exit_seen)};
    if (best < 0 || key < best_key) {
      best = static_cast<int>(i);
      best_key = key;
    }
  }
  return best;
}

const Worker* unanswering(const std::vector<Worker>& workers, const Worker& failed) {
  if (!failed.error || !failed.error->follows_peer) return nullptr;
  for (int64_t rank : failed.error->unanswered) {
    for (const auto& w : workers) {
      if (w.rank != rank || &w == &failed) continue;
      // One that failed of an error of its own is no silent rank (and
      // first_failure names it anyway).
      const bool own_error = w.exited && !exited_ok(w.status) && (!w.error || !w.error->follows_peer) && !w.stopped;
      if (!own_error) return &w;
    }
  }
  return nullptr;
}

std::string failure_reason(const std::vector<Worker>& workers, int failed) {
  const Worker& f = workers.at(static_cast<size_t>(failed));
  const std::string message =
      f.error && !f.error->message.empty() ? f.error->message.substr(0, f.error->message.find('\n')) : "";
  // A rank that waited, naming the one that stopped answering: that one is
  // the cause, and named first.
  if (const Worker* silent = unanswering(workers, f)) {
    return format("rank %lld (pid %d) stopped answering%s; rank %lld (pid %d), which waited for it, reported: %s",
                  static_cast<long long>(silent->rank), static_cast<int>(silent->pid),
                  silent->state_at_stop.empty() ? " (its process was running)"
                                                : (" (it was " + silent->state_at_stop + ")").c_str(),
                  static_cast<long long>(f.rank), static_cast<int>(f.pid), message.c_str());
  }
  if (f.error && f.error->follows_peer && !f.error->unanswered.empty()) {
    bool local = false;
    for (const auto& w : workers) local = local || w.rank == f.error->unanswered.front();
    if (!local) {  // a rank of another node: this launcher cannot see it
      return format("rank %lld (on another node) stopped answering; rank %lld (pid %d), which waited for it, "
                    "reported: %s",
                    static_cast<long long>(f.error->unanswered.front()), static_cast<long long>(f.rank),
                    static_cast<int>(f.pid), message.c_str());
    }
  }
  // One whose error came before the launcher stopped it ended of the
  // launcher's signal, which is not what went wrong.
  const bool stopped_after_its_error = f.stopped && f.error && WIFSIGNALED(f.status);
  std::string reason = format(
      "rank %lld (pid %d) %s", static_cast<long long>(f.rank), static_cast<int>(f.pid),
      stopped_after_its_error
          ? format("failed, and the launcher stopped it with SIG%s before it exited",
                   sigabbrev_np(WTERMSIG(f.status)) ? sigabbrev_np(WTERMSIG(f.status)) : "?")
                .c_str()
          : describe_status(f.status).c_str());
  if (!message.empty()) reason += ": " + message;
  return reason;
}

std::string failure_key(const std::string& reason) {
  // Any rank's (they fail alike), any pid, any temporary name.
  static const std::regex pids("rank [0-9]+ \\(pid [0-9]+\\)|pid [0-9]+|\\.tmp-[0-9]+");
  return std::regex_replace(reason, pids, "");
}

std::chrono::milliseconds RestartBackoff::after(const std::string& reason, Clock::duration ran) {
  const std::string key = failure_key(reason);
  const bool same = key == last_ && ran < kStartupWindow;
  repeats_ = same ? repeats_ + 1 : 0;
  last_ = key;
  if (!same) return std::chrono::milliseconds(0);
  const int64_t seconds = std::min<int64_t>(int64_t{1} << std::min<int64_t>(repeats_ - 1, 10), kMaxBackoff.count());
  return std::chrono::seconds(seconds);
}

std::string RestartBackoff::describe() const {
  if (repeats_ == 0) return "";
  if (repeats_ == 1) {
    return format("the same failure as the attempt before, within %lld s of its start: ",
                  static_cast<long long>(kStartupWindow.count()));
  }
  return format("the same failure as the %lld attempts before, each within %lld s of its start: ",
                static_cast<long long>(repeats_), static_cast<long long>(kStartupWindow.count()));
}

}  // namespace tandem::launch::internal
