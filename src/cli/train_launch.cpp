// tandem train's own launcher (train_sweep.h): the workers of
// `tandem train --nproc-per-node N`, started as `tandem launch` would, once
// what would make every one of them fail has been named here.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tandem/data/source.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/parallel_layout.h"
#include "tandem/engine/worker_footprint.h"
#include "tandem/launch/launcher.h"
#include "tandem/util/check.h"
#include "train_sweep.h"

namespace tandem::cli::internal {

// This program's path, for re-running it as workers.
std::string self_executable() {
  char path[4096];
  ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  return std::string(path, static_cast<size_t>(n));
}

// Note [worker footprint]: CPU workers measured against the machine before
// they start (not with --skip-resource-check; GPUs bound the count there).
void check_resources(const engine::TrainOptions& o, int64_t workers) {
  if (o.skip_resource_check || workers < 2 || !engine::parse_device(o.device).is_cpu()) return;
  const auto footprint = engine::measure_worker_footprint(o, workers);
  for (const auto& line : engine::check_worker_resources(workers, footprint, engine::machine_resources())) {
    std::fprintf(stderr, "tandem: warning: %s\n", line.c_str());
  }
}

// The short form of `tandem launch --nproc-per-node N -- tandem train ...`:
// the workers run the command line `args`; RANK set tells them they are
// workers. A --device that no worker could use, or flags that cannot work
// with nproc workers, are named once, here, not by each.
int launch_workers(const engine::TrainOptions& options, const std::vector<std::string>& args, int64_t nproc,
                   const std::vector<std::pair<std::string, std::string>>& env) {
  engine::parse_device(options.device);
  engine::check_train_options(options);
  engine::check_train_ranks(options, nproc);
  // Rank 0's output files: one that cannot be written is named here,
  // once, not after the rendezvous (where the other ranks then add a lost
  // connection of their own).
  engine::check_train_outputs(options, 0);
  // Data folders that are not there, likewise (each worker named them).
  data::check_spec_folder(options.data);
  if (!options.val_data.empty()) data::check_spec_folder(options.val_data);
  check_resources(options, nproc);
  launch::LaunchOptions lo;
  lo.nproc_per_node = nproc;
  lo.command.push_back(self_executable());
  lo.command.push_back("train");
  lo.command.insert(lo.command.end(), args.begin(), args.end());
  lo.extra_env = {{kSelfLaunched, "1"}};
  lo.extra_env.insert(lo.extra_env.end(), env.begin(), env.end());
  lo.max_restarts = options.max_restarts;
  auto result = launch::run_workers(lo, [] { return dist::pick_free_port("127.0.0.1"); });
  if (result.exit_code != 0) std::fprintf(stderr, "tandem launch: %s\n", result.summary().c_str());
  return result.exit_code;
}

}  // namespace tandem::cli::internal
