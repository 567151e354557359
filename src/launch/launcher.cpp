#include "tandem/launch/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>  // mkdtemp
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <thread>

#include "tandem/launch/worker_error.h"
#include "signals.h"
#include "worker.h"
#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/table.h"

namespace tandem::launch {

namespace {

// 128 random bits as 32 hex digits: a job's token.
std::string random_token() {
  std::random_device device;
  std::string token;
  for (int i = 0; i < 4; ++i) token += format("%08x", device());
  return token;
}

using namespace internal;

// Each worker's stdout and stderr reach the launcher through pipes of its
// own: two descriptors kept per worker (four while it starts). Raises this
// process's soft limit on open files as far as that needs and its hard
// limit allows. Throws when even the hard limit is too low.
void reserve_open_files(int64_t workers) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  std::error_code ec;
  rlim_t open_now = 0;
  for (std::filesystem::directory_iterator it("/proc/self/fd", ec), end; !ec && it != end; it.increment(ec)) {
    ++open_now;
  }
  const rlim_t need = open_now + 2 * static_cast<rlim_t>(workers) + 16;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= need) return;
  TANDEM_CHECK(limit.rlim_max == RLIM_INFINITY || limit.rlim_max >= need, "--nproc-per-node ",
               workers, ": the launcher keeps two pipes per worker, about ", need,
               " open files, but this process may open at most ", limit.rlim_max,
               " (ulimit -Hn); raise that limit or start fewer workers");
  rlimit raised = limit;
  raised.rlim_cur = need;
  TANDEM_CHECK(setrlimit(RLIMIT_NOFILE, &raised) == 0, "--nproc-per-node ", workers,
               ": could not raise the limit on open files from ", limit.rlim_cur, " to ", need, ": ",
               std::strerror(errno));
}

// reserve_open_files for one run; puts the limit back as it found it,
// which is also the limit the workers get (restore() in each, before exec).
class OpenFilesScope {
 public:
  explicit OpenFilesScope(int64_t workers) {
    known_ = getrlimit(RLIMIT_NOFILE, &found_) == 0;
    reserve_open_files(workers);
  }
  ~OpenFilesScope() { restore(); }
  void restore() const {  // async-signal-safe: one system call
    if (known_) setrlimit(RLIMIT_NOFILE, &found_);
  }

 private:
  bool known_ = false;
  rlimit found_{};
};

// The workers' records, their output and the verdict on a failure:
// src/launch/worker.h.


struct Attempt {
  std::vector<Worker> workers;  // those started
  std::vector<std::string> error_files;  // each worker's TANDEM_ERROR_FILE, or ""
  int failed = -1;           // index of the worker that failed first (Note [first failure])
  int forwarded_signal = 0;  // the stop signal the launcher received
  bool starting_stopped = false;  // that signal came before every worker was started

  // " while starting the workers (k of n started)" when it did, else "".
  std::string starting_note(int64_t wanted) const {
    return starting_stopped ? format(" while starting the workers (%zu of %lld started)", workers.size(),
                                     static_cast<long long>(wanted))
                            : "";
  }

  Attempt() = default;
  Attempt(const Attempt&) = delete;
  Attempt& operator=(const Attempt&) = delete;
  // Normally every worker is reaped and every pipe closed by now; when
  // starting the workers failed part way (fork or pipe2 refused), this
  // ends the ones already started, so none outlives the error.
  ~Attempt() {
    for (auto& w : workers) {
      if (w.pid > 0 && !w.exited) {
        kill(-w.pid, SIGKILL);
        kill(w.pid, SIGKILL);
        waitpid(w.pid, nullptr, 0);
      }
      for (Stream* st : {&w.out, &w.err}) {
        if (st->fd >= 0) close(st->fd);
      }
    }
  }
};

}  // namespace

LaunchResult run_workers(const LaunchOptions& o, const std::function<int()>& pick_port,
                         std::FILE* out, std::FILE* err) {
  // What the options alone show to be wrong: usage errors (exit 2).
  TANDEM_CHECK_USAGE(o.nproc_per_node >= 1 && o.nproc_per_node <= kMaxLocalWorkers,
                     "--nproc-per-node: expected 1 to ", kMaxLocalWorkers, " workers on one node, got ",
                     o.nproc_per_node);
  TANDEM_CHECK_USAGE(o.nnodes >= 1, "--nnodes: expected >= 1, got ", o.nnodes);
  TANDEM_CHECK_USAGE(o.node_rank >= 0 && o.node_rank < o.nnodes, "--node-rank: expected 0..",
                     o.nnodes - 1, ", got ", o.node_rank);
  TANDEM_CHECK_USAGE(o.max_restarts >= 0, "--max-restarts: expected >= 0, got ", o.max_restarts);
  TANDEM_CHECK_USAGE(o.stop_grace_seconds >= 0 && o.stop_grace_seconds <= 86400,
                     "--stop-grace: expected 0 to 86400 seconds, got ", o.stop_grace_seconds);
  TANDEM_CHECK_USAGE(!o.command.empty(), "launch: no command to run (expected -- CMD ARGS...)");
  TANDEM_CHECK_USAGE(o.master_port != 0 || o.nnodes == 1,
                     "--master-port is required when --nnodes > 1 (every node must use the same port)");
  TANDEM_CHECK_USAGE(o.master_port >= 0 && o.master_port < 65536, "--master-port: expected 1..65535");

  const int64_t world = o.nproc_per_node * o.nnodes;
  auto base_env = env::snapshot();
  bool omp_set = env::get("OMP_NUM_THREADS").has_value();
  for (const auto& [k, v] : o.extra_env) omp_set = omp_set || k == "OMP_NUM_THREADS";
  int64_t cores = std::max<unsigned>(std::thread::hardware_concurrency(), 1u);
  int64_t omp_threads = std::max<int64_t>(cores / o.nproc_per_node, 1);

  std::string token = o.job_token;
  if (token.empty() && o.nnodes == 1) token = random_token();

  OpenFilesScope open_files(o.nproc_per_node);
  ErrorFolder error_folder;

  SignalScope signals;
  const pid_t launcher = getpid();
  LaunchResult result;
  RestartBackoff backoff;  // Note [restart back-off]
  for (int64_t attempt = 0;; ++attempt) {
    const auto attempt_began = Clock::now();
    int port = o.master_port != 0 ? o.master_port : pick_port();
    Attempt a;
    a.workers.reserve(static_cast<size_t>(o.nproc_per_node));
    int stop_signal = 0;
    for (int64_t i = 0; i < o.nproc_per_node; ++i) {
      // Starting many workers takes a while (a fork each); a SIGINT or
      // SIGTERM meanwhile stops it here rather than after the last one.
      if ((stop_signal = take_stop_signal()) != 0) break;
      Worker& w = a.workers.emplace_back();
      w.local_rank = i;
      w.rank = o.node_rank * o.nproc_per_node + i;
      // The environment, prepared before fork (no allocation in the child).
      std::vector<std::string> env = base_env;
      auto set = [&](const std::string& key, const std::string& value) {
        for (auto& entry : env) {
          if (entry.compare(0, key.size() + 1, key + "=") == 0) {
            entry = key + "=" + value;
            return;
          }
        }
        env.push_back(key + "=" + value);
      };
      set("RANK", std::to_string(w.rank));
      set("WORLD_SIZE", std::to_string(world));
      set("LOCAL_RANK", std::to_string(i));
      set("LOCAL_WORLD_SIZE", std::to_string(o.nproc_per_node));
      set("GROUP_RANK", std::to_string(o.node_rank));
      set("MASTER_ADDR", o.master_addr);
      set("MASTER_PORT", std::to_string(port));
      set("TANDEM_RESTART_COUNT", std::to_string(attempt));
      if (!token.empty()) set("TANDEM_JOB_TOKEN", token);
      a.error_files.push_back(error_folder.file_for(w.rank));
      if (!a.error_files.back().empty()) set(kErrorFileVariable, a.error_files.back());
      if (!omp_set) set("OMP_NUM_THREADS", std::to_string(omp_threads));
      for (const auto& [k, v] : o.extra_env) set(k, v);
      std::vector<char*> envp, argv;
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);
      std::vector<std::string> command = o.command;
      for (auto& c : command) argv.push_back(c.data());
      argv.push_back(nullptr);

      int out_pipe[2], err_pipe[2];
      TANDEM_CHECK(pipe2(out_pipe, O_CLOEXEC) == 0, "launch: pipe2 failed for rank ", w.rank, ": ",
                   std::strerror(errno));
      if (pipe2(err_pipe, O_CLOEXEC) != 0) {
        int why = errno;
        close(out_pipe[0]);
        close(out_pipe[1]);
        TANDEM_CHECK(false, "launch: pipe2 failed for rank ", w.rank, ": ", std::strerror(why));
      }
      // The child starts with our signals blocked: until it has dropped our
      // handlers, a SIGTERM meant for it would otherwise run our handler in
      // the child and reach our signal pipe as if sent to the launcher.
      sigset_t ours, previous;
      sigemptyset(&ours);
      for (int s : kHandledSignals) sigaddset(&ours, s);
      sigprocmask(SIG_BLOCK, &ours, &previous);
      pid_t pid = fork();
      if (pid == 0) {  // the worker: only async-signal-safe calls until exec
        struct sigaction dfl {};
        dfl.sa_handler = SIG_DFL;
        for (int s : kHandledSignals) sigaction(s, &dfl, nullptr);
        close(g_signal_pipe[0]);
        close(g_signal_pipe[1]);
        sigprocmask(SIG_SETMASK, &previous, nullptr);  // a pending SIGTERM now ends it
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        open_files.restore();  // the limit as the launcher found it
        if (getppid() != launcher) _exit(127);
        dup2(out_pipe[1], STDOUT_FILENO);
        dup2(err_pipe[1], STDERR_FILENO);
        execvpe(argv[0], argv.data(), envp.data());
        // A shell's codes: 127 for a command not found, 126 for one found
        // that cannot run (not executable, a folder).
        const int code = errno == ENOENT || errno == ENOTDIR ? 127 : 126;
        const char* why = std::strerror(errno);
        struct stat st {};  // a path to a folder fails with EACCES, "Permission denied"
        if (errno == EACCES && std::strchr(argv[0], '/') != nullptr && stat(argv[0], &st) == 0 && S_ISDIR(st.st_mode)) {
          why = "a directory, not a program";
        }
        ssize_t ignored = write(STDERR_FILENO, "cannot run ", 11);
        ignored = write(STDERR_FILENO, argv[0], std::strlen(argv[0]));
        ignored = write(STDERR_FILENO, ": ", 2);
        ignored = write(STDERR_FILENO, why, std::strlen(why));
        ignored = write(STDERR_FILENO, "\n", 1);
        (void)ignored;
        _exit(code);
      }
      int fork_errno = errno;
      sigprocmask(SIG_SETMASK, &previous, nullptr);
      if (pid < 0) {
        for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
        TANDEM_CHECK(false, "launch: fork failed for rank ", w.rank, " (", a.workers.size() - 1,
                     " of ", o.nproc_per_node, " workers started): ", std::strerror(fork_errno));
      }
      setpgid(pid, pid);  // also here, so that it holds before we signal the group
      close(out_pipe[1]);
      close(err_pipe[1]);
      fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
      fcntl(err_pipe[0], F_SETFL, O_NONBLOCK);
      w.pid = pid;
      w.out = {out_pipe[0], "", out};
      w.err = {err_pipe[0], "", err};
    }

    // Watch until every worker has exited (Note [worker life cycle]).
    std::optional<Clock::time_point> kill_at;
    bool killed = false;
    std::optional<Clock::time_point> stop_began;       // when stop_all signalled the workers
    std::optional<Clock::time_point> peer_wait_until;  // Note [first failure]
    // A stopped worker (SIGSTOP, a debugger's ^Z) would hold a SIGINT or
    // SIGTERM pending until SIGKILL, --stop-grace later; SIGCONT after it
    // lets it act on it now.
    auto signal_all = [&](int s) {
      for (auto& w : a.workers) {
        if (w.exited) continue;
        kill(-w.pid, s);
        if (is_stop_signal(s)) kill(-w.pid, SIGCONT);
      }
    };
    auto start_grace = [&] {
      if (!kill_at) {
        kill_at = Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o.stop_grace_seconds * 1000));
      }
    };
    auto stop_all = [&] {
      if (kill_at) return;
      stop_began = Clock::now();
      signal_all(SIGTERM);
      start_grace();
    };
    // A stop signal to the launcher: passed to every worker, which
    // then has --stop-grace to end.
    auto forward = [&](int s) {
      if (a.forwarded_signal == 0) {
        std::fprintf(err, "tandem launch: got SIG%s%s, passing it to %s\n", sigabbrev_np(s),
                     a.starting_note(o.nproc_per_node).c_str(), a.starting_stopped ? "them" : "the workers");
        std::fflush(err);
      }
      a.forwarded_signal = s;
      signal_all(s);
      start_grace();
    };
    // Note [first failure]: the workers still running are looked at before
    // any signal reaches them (stop_all continues a stopped one), so that a
    // rank named as not answering is judged by what it was doing.
    auto stop_for_failure = [&] {
      for (auto& w : a.workers) {
        if (!w.exited) w.state_at_stop = process_state(w.pid);
      }
      const int i = first_failure(a.workers, stop_began);
      const Worker& w = a.workers[static_cast<size_t>(i)];
      const Worker* silent = unanswering(a.workers, w);
      std::fprintf(err, "tandem launch: rank %lld (pid %d) %s%s; stopping the other workers\n",
                   static_cast<long long>(w.rank), static_cast<int>(w.pid), describe_status(w.status).c_str(),
                   silent == nullptr ? ""
                                     : format(", naming rank %lld (pid %d) as not answering",
                                              static_cast<long long>(silent->rank), static_cast<int>(silent->pid))
                                           .c_str());
      std::fflush(err);
      stop_all();
    };
    if (stop_signal != 0) {
      a.starting_stopped = true;
      forward(stop_signal);
    }
    size_t alive = a.workers.size();
    bool any_failed = false;
    while (alive > 0) {
      std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
      std::vector<Stream*> streams{nullptr};
      std::vector<int64_t> ranks{0};
      for (auto& w : a.workers) {
        for (Stream* s : {&w.out, &w.err}) {
          if (s->fd < 0) continue;
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
          ranks.push_back(w.rank);
        }
      }
      int ready = poll(fds.data(), fds.size(), 100);
      if (ready > 0) {
        if (fds[0].revents & POLLIN) {
          if (int s = take_stop_signal()) forward(s);
        }
        for (size_t k = 1; k < fds.size(); ++k) {
          if (fds[k].revents & (POLLIN | POLLHUP | POLLERR)) pump(*streams[k], ranks[k], false);
        }
      }
      for (size_t i = 0; i < a.workers.size(); ++i) {
        Worker& w = a.workers[i];
        if (w.exited) continue;
        int status = 0;
        if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
        w.exited = true;
        w.status = status;
        w.exit_seen = Clock::now();
        w.stopped = stop_began.has_value();
        --alive;
        if (exited_ok(status)) continue;
        if (!a.error_files[i].empty()) w.error = read_worker_error(a.error_files[i]);
        if (a.forwarded_signal != 0 || stop_began) continue;
        any_failed = true;
        // A failure that followed a peer's waits a moment for that peer's
        // own to be seen (Note [first failure]); any other stops the job.
        if (w.error && w.error->follows_peer) {
          if (!peer_wait_until) peer_wait_until = w.exit_seen + kPeerFailureWait;
        } else {
          stop_for_failure();
        }
      }
      if (alive > 0 && peer_wait_until && !stop_began && !kill_at && Clock::now() >= *peer_wait_until) {
        stop_for_failure();
      }
      if (kill_at && !killed && Clock::now() >= *kill_at) {
        signal_all(SIGKILL);
        killed = true;
      }
    }
    if (any_failed && a.forwarded_signal == 0) a.failed = first_failure(a.workers, stop_began);
    // Every worker is reaped; copy what is left in the pipes (a grandchild
    // that still holds one open is not waited for).
    for (auto& w : a.workers) {
      for (Stream* s : {&w.out, &w.err}) {
        if (s->fd < 0) continue;
        pump(*s, w.rank, true);
        if (s->fd >= 0) {
          close(s->fd);
          s->fd = -1;
        }
      }
      kill(-w.pid, SIGKILL);  // leftover members of its process group
    }

    if (a.forwarded_signal) {
      result.exit_code = 128 + a.forwarded_signal;
      result.reason = format("stopped by SIG%s", sigabbrev_np(a.forwarded_signal));
      result.reason += a.starting_note(o.nproc_per_node);
      return result;
    }
    if (a.failed < 0) {
      result.exit_code = 0;
      result.reason.clear();
      return result;
    }
    result.reason = failure_reason(a.workers, a.failed);
    // A worker refused its flags (a usage error, exit 2, from a check only
    // the model or the mesh can make) and every other one refused too or
    // was stopped by the launcher (perhaps while refusing): the command
    // line is at fault, and a restart would refuse it again.
    auto refused = [](const Worker& w) { return w.exited && WIFEXITED(w.status) && WEXITSTATUS(w.status) == 2; };
    const bool usage = std::any_of(a.workers.begin(), a.workers.end(), refused) &&
                       std::all_of(a.workers.begin(), a.workers.end(),
                                   [&](const Worker& w) { return refused(w) || w.stopped || !w.exited; });
    if (usage || attempt >= o.max_restarts) {
      result.exit_code = usage ? 2 : 1;
      return result;
    }
    ++result.restarts;
    const auto delay = backoff.after(result.reason, Clock::now() - attempt_began);
    std::fprintf(err, "tandem launch: %s; %srestarting all %lld workers%s (restart %lld of %lld)\n",
                 result.reason.c_str(), backoff.repeats() > 0 ? backoff.describe().c_str() : "",
                 static_cast<long long>(o.nproc_per_node),
                 delay.count() > 0 ? format(" in %lld s", static_cast<long long>(delay.count() / 1000)).c_str() : "",
                 static_cast<long long>(result.restarts), static_cast<long long>(o.max_restarts));
    std::fflush(err);
    // The wait gives way to a stop signal: the launcher then ends as it
    // would with its workers running.
    if (delay.count() > 0) {
      pollfd signals{g_signal_pipe[0], POLLIN, 0};
      const auto until = Clock::now() + delay;
      while (Clock::now() < until) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
        if (poll(&signals, 1, static_cast<int>(std::max<int64_t>(1, left))) > 0) {
          if (int s = take_stop_signal()) {
            result.exit_code = 128 + s;
            result.reason = format("stopped by SIG%s while waiting to restart", sigabbrev_np(s));
            return result;
          }
        }
      }
    }
  }
}

std::string LaunchResult::summary() const {
  if (restarts == 0) return reason;
  return format("%s (after %lld restart%s)", reason.c_str(), static_cast<long long>(restarts), restarts == 1 ? "" : "s");
}

}  // namespace tandem::launch
