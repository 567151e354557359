// tandem train --nproc-per-node 1,2,4: the scaling sweep, one job per
// process count, and its scaling table (train_sweep.h).
#include "train_sweep.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "tandem/engine/trainer.h"
#include "tandem/launch/launcher.h"
#include "tandem/observe/metrics.h"
#include "tandem/util/parse.h"
#include "tandem/util/stats.h"
#include "tandem/util/table.h"

namespace tandem::cli::internal {

// --nproc-per-node 1,2,4: the process counts of a scaling sweep; nullopt for
// one count (N or auto).
std::optional<std::vector<int64_t>> sweep_counts(const std::string& text) {
  if (text.find(',') == std::string::npos) return std::nullopt;
  std::vector<int64_t> counts;
  for (const auto& part : split(text, ',')) {
    auto n = parse_int(part);
    if (!n || *n < 1 || *n > launch::kMaxLocalWorkers) {
      throw UsageError(format("--nproc-per-node: a sweep lists process counts from 1 to %lld, such as "
                              "1,2,4; got '",
                              static_cast<long long>(launch::kMaxLocalWorkers)) +
                       text + "'");
    }
    counts.push_back(*n);
  }
  return counts;
}

// One run of a sweep: its process count, global batch and epochs.
struct SweepRun {
  int64_t processes = 0;
  int64_t global_batch = 0;
  std::vector<observe::EpochMetrics> epochs;
};

// The scaling table over the sweep's runs, with the speed-up and the scaling
// efficiency against the first run.
void print_sweep_table(const engine::TrainOptions& o, const std::vector<SweepRun>& runs) {
  Table table({"devices", "global batch", "batch per process", "epoch time (s)", "img/s", "speed-up",
               "efficiency", "test acc"});
  double first_rate = 0;
  for (const auto& run : runs) {
    std::vector<double> seconds, rates;
    for (const auto& m : run.epochs) {
      if (!m.partial) seconds.push_back(m.epoch_seconds);
      rates.push_back(m.images_per_second);
    }
    double rate = median(rates);
    if (&run == &runs.front()) first_rate = rate;
    double speedup = first_rate > 0 ? rate / first_rate : 0.0;
    double scale = static_cast<double>(run.processes) / static_cast<double>(runs.front().processes);
    const auto* last = run.epochs.empty() ? nullptr : &run.epochs.back();
    table.add_row({format("%lld x %s", static_cast<long long>(run.processes), o.device.c_str()),
                   std::to_string(run.global_batch), std::to_string(run.global_batch / run.processes),
                   seconds.empty() ? "-" : format("%.1f", median(seconds)), format("%.0f", rate),
                   format("%.2fx", speedup), format("%.2f", speedup / scale),
                   last != nullptr && last->evaluated ? format("%.2f%%", 100 * last->test_acc) : "-"});
  }
  std::printf("\nscaling table\n%s", table.render().c_str());
  std::printf("(epoch time: the median of full epochs; speed-up: training img/s, the median over epochs, "
              "against the first row's; efficiency: speed-up / (processes / %lld))\n",
              static_cast<long long>(runs.front().processes));
  std::fflush(stdout);
}

// --nproc-per-node 1,2,4: the job launched once per count, one after the
// other, each run's epochs read back from a --metrics-out file of its own.
int train_sweep(const std::vector<int64_t>& counts, const std::vector<std::string>& args,
                const engine::TrainOptions& o, const FlagSet& flags) {
  const std::string sweep = "--nproc-per-node " + o.nproc_per_node;
  for (const char* name : {"metrics-out", "tensorboard", "checkpoint-dir", "resume", "export-weights", "profile-out", "max-restarts"}) {
    if (flags.given(name)) {
      throw UsageError(std::string("--") + name + " belongs to a single run; " + sweep +
                       " runs the job once per process count");
    }
  }
  if (o.strategy == engine::Strategy::kNone || o.strategy == engine::Strategy::kDp) {
    throw UsageError("--strategy " + engine::strategy_name(o.strategy) + " runs in one process; " + sweep +
                     " needs a strategy over processes (auto, ddp, allreduce or fsdp)");
  }
  if (!o.mesh.empty()) {
    throw UsageError("--mesh " + o.mesh.text() + " lays out one number of ranks; " + sweep +
                     " runs the job once per process count (leave out --mesh)");
  }
  if (o.strategy == engine::Strategy::kPipeline) {
    throw UsageError(sweep + " measures data-parallel scaling (auto, ddp, allreduce or fsdp); a "
                     "pipeline over processes takes one count, --nproc-per-node N, a stage per process");
  }
  engine::check_train_options(o);  // once, before the first run
  check_resources(o, *std::max_element(counts.begin(), counts.end()));
  for (auto n : counts) {
    if (o.batch_per_process == 0 && o.batch_size % n != 0) {
      throw UsageError(format("--batch-size %lld is not divisible by %lld processes (%s); give "
                              "another batch size, or --batch-per-process",
                              static_cast<long long>(o.batch_size), static_cast<long long>(n),
                              sweep.c_str()));
    }
    engine::check_train_ranks(o, n);
  }
  namespace fs = std::filesystem;
  std::string pattern = (fs::temp_directory_path() / "tandem-sweep-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw Error("cannot make a temporary directory " + pattern);
  struct Remove {
    std::string dir;
    ~Remove() {
      std::error_code ignored;
      fs::remove_all(dir, ignored);
    }
  } remove{pattern};

  std::vector<SweepRun> runs;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t n = counts[i];
    std::printf("\ntandem train: scaling sweep, run %zu of %zu: %lld process%s\n", i + 1, counts.size(),
                static_cast<long long>(n), n == 1 ? "" : "es");
    std::fflush(stdout);
    const std::string metrics = pattern + "/run-" + std::to_string(i) + ".jsonl";
    launch::LaunchOptions lo;
    lo.nproc_per_node = n;
    lo.command = {self_executable(), "train"};
    lo.command.insert(lo.command.end(), args.begin(), args.end());
    lo.extra_env = {{kSelfLaunched, "1"}};
    // Later flags override earlier ones: this run's count and metrics file.
    for (const auto& extra : {std::string("--nproc-per-node"), std::to_string(n),
                              std::string("--metrics-out"), metrics}) {
      lo.command.push_back(extra);
    }
    auto result = launch::run_workers(lo, [] { return dist::pick_free_port("127.0.0.1"); });
    if (result.exit_code != 0) {
      std::fprintf(stderr, "tandem launch: %s\ntandem train: the sweep stopped at run %zu of %zu (%lld "
                   "process%s)\n", result.reason.c_str(), i + 1, counts.size(),
                   static_cast<long long>(n), n == 1 ? "" : "es");
      return result.exit_code;
    }
    const int64_t global = o.batch_per_process > 0 ? o.batch_per_process * n : o.batch_size;
    runs.push_back({n, global, observe::read_metrics(metrics)});
  }
  print_sweep_table(o, runs);
  return 0;
}

}  // namespace tandem::cli::internal
