// tandem/launch/launcher.h: start and watch the local workers of a job.
//
// `tandem launch` (and `tandem train --nproc-per-node N`): one process per
// local rank, each with torchrun's environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) and
// OMP_NUM_THREADS = cores / nproc_per_node unless the caller set it.
//
// Life cycle of a worker (Note [worker life cycle]):
//   spawned  in its own process group, with PR_SET_PDEATHSIG = SIGKILL, so it
//            dies with the launcher even if the launcher is SIGKILLed;
//   running  its stdout and stderr lines are copied to the launcher's, each
//            prefixed "[rank R] "; SIGINT / SIGTERM sent to the launcher are
//            forwarded to every worker;
//   failed   the first worker to exit non-zero (or be killed) ends the
//            attempt: the others get SIGTERM, then SIGKILL after
//            stop_grace_seconds (a failure that followed a peer's first
//            waits up to kPeerFailureWait for that peer's); then either a
//            restart of all workers (max_restarts) or the launcher exits
//            non-zero naming the rank that failed first (Note [first
//            failure] in launch/worker_error.h);
//   reaped   the launcher waits for every worker before it returns: no
//            worker outlives it.
//
// No torch here: the launcher stays light.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace tandem::launch {

// The most worker processes on one node (also the largest count of a
// scaling sweep): a larger --nproc-per-node is refused before any starts.
inline constexpr int64_t kMaxLocalWorkers = 4096;

struct LaunchOptions {
  int64_t nproc_per_node = 1;
  int64_t nnodes = 1;
  int64_t node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: pick_port() picks one (single node only)
  int64_t max_restarts = 0;       // restart all workers up to this many times after a failure
  double stop_grace_seconds = 5;  // SIGTERM, then SIGKILL after this long
  std::vector<std::string> command;  // argv of every worker
  std::vector<std::pair<std::string, std::string>> extra_env;  // added to every worker's
  // TANDEM_JOB_TOKEN for the workers (Note [job token] in dist/rendezvous.h).
  // Empty: a fresh random one for a single-node job; for several nodes none
  // is set (give every node the same --job-token).
  std::string job_token;
};

struct LaunchResult {
  int exit_code = 0;   // 0 when every worker of the last attempt exited 0
  std::string reason;  // why not, e.g. "rank 1 (pid 4242) was killed by signal 9 (SIGKILL)", or
                       // "rank 0 (pid 4241) exited with code 1: " and its error's first line
  int64_t restarts = 0;

  // The reason, with "(after N restarts)" when there were any: the line a
  // launcher prints last.
  std::string summary() const;
};

// Runs the job to its end. `pick_port` supplies a free port when
// master_port is 0. Progress lines ("tandem launch: ...") and the workers'
// prefixed output go to `out` and `err`. Throws tandem::Error for invalid
// options or a command that cannot be started.
LaunchResult run_workers(const LaunchOptions& options, const std::function<int()>& pick_port,
                         std::FILE* out = stdout, std::FILE* err = stderr);

}  // namespace tandem::launch
