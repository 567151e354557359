// tandem launch: start N local workers of a distributed job and watch them.
#include <algorithm>
#include <cstdio>

#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/dist/process_group.h"
#include "tandem/launch/launcher.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

FlagSet launch_flags(launch::LaunchOptions& o, int64_t& port) {
  FlagSet flags("tandem launch",
                "Start one worker process per local rank with torchrun's environment (RANK,\n"
                "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), prefix their output with the rank,\n"
                "forward SIGINT, SIGTERM, SIGHUP and SIGQUIT, and stop every worker when one fails.\n\n"
                "usage: tandem launch [flags] -- CMD ARGS...");
  flags.add_int("nproc-per-node", "N", &o.nproc_per_node, "worker processes on this node", 1);
  flags.add_int("nnodes", "N", &o.nnodes, "nodes in the job", 1);
  flags.add_int("node-rank", "R", &o.node_rank, "this node's index, 0..nnodes-1", 0);
  flags.add_string("master-addr", "HOST", &o.master_addr, "address of rank 0's node");
  flags.add_int("master-port", "PORT", &port, "rank 0's store port (0: a free one)", 0);
  flags.add_int("max-restarts", "K", &o.max_restarts,
                "after a failure, restart all workers up to K times", 0);
  flags.add_double("stop-grace", "SECONDS", &o.stop_grace_seconds,
                   "after SIGTERM, wait this long before SIGKILL", 0, 86400);
  flags.add_string("job-token", "TOKEN", &o.job_token,
                   "a process must carry this token to join the job (TANDEM_JOB_TOKEN); "
                   "default: a random one on a single node, none on several (give each "
                   "node the same)");
  return flags;
}

}  // namespace

std::string launch_help() {
  launch::LaunchOptions o;
  int64_t port = 0;
  return launch_flags(o, port).help();
}

int launch_command(const std::vector<std::string>& args) {
  launch::LaunchOptions o;
  int64_t port = 0;
  auto flags = launch_flags(o, port);
  auto dashes = std::find(args.begin(), args.end(), "--");
  flags.parse({args.begin(), dashes});
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  if (dashes == args.end() || dashes + 1 == args.end()) {
    throw UsageError("tandem launch: no command (expected: tandem launch [flags] -- CMD ARGS...)");
  }
  o.command.assign(dashes + 1, args.end());
  if (o.nproc_per_node > launch::kMaxLocalWorkers) {
    throw UsageError(format("--nproc-per-node: expected at most %lld workers on one node, got %lld",
                            static_cast<long long>(launch::kMaxLocalWorkers),
                            static_cast<long long>(o.nproc_per_node)));
  }
  if (port < 0 || port > 65535) {
    throw UsageError(format("--master-port: expected 0 to 65535 (0: a free one), got %lld", static_cast<long long>(port)));
  }
  o.master_port = static_cast<int>(port);
  auto result = launch::run_workers(o, [&] { return dist::pick_free_port(o.master_addr); });
  if (result.exit_code != 0) {
    std::fprintf(stderr, "tandem launch: %s\n", result.summary().c_str());
  }
  return result.exit_code;
}

}  // namespace tandem::cli
