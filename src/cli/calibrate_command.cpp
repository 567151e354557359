// tandem plan --calibrate (calibrate_command.h).
#include "calibrate_command.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/dist/process_group.h"
#include "tandem/dist/rendezvous.h"
#include "tandem/launch/launcher.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "train_sweep.h"

namespace tandem::cli::internal {

int time_links_worker(const std::string& path) {
  const auto rendezvous = dist::rendezvous_from_env();
  TANDEM_CHECK_USAGE(rendezvous.has_value(), "--time-links is run by tandem plan --calibrate as its two workers");
  dist::GroupOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  dist::ProcessGroup group(*rendezvous, options);
  const auto times = plan::time_allreduces(group);
  if (group.rank() == 0) std::ofstream(path) << nlohmann::json(times).dump();
  return 0;
}

int calibrate_machine(const plan::CalibrateOptions& o, const std::string& path) {
  auto say = [](const std::string& line) { std::fprintf(stderr, "[calibrate] %s\n", line.c_str()); };
  auto links = [&] {
    // Two processes on loopback, as a job's ranks are (threads of one
    // process wake each other in a fraction of the time).
    const auto out = (std::filesystem::temp_directory_path() /
                      ("tandem-links-" + std::to_string(getpid()) + ".json")).string();
    launch::LaunchOptions lo;
    lo.nproc_per_node = 2;
    lo.command = {self_executable(), "plan", "--time-links", out};
    lo.extra_env = {{"OMP_NUM_THREADS", "1"}};
    std::FILE* quiet = std::fopen("/dev/null", "w");
    const auto result = launch::run_workers(lo, [] { return dist::pick_free_port(); }, quiet, stderr);
    if (quiet) std::fclose(quiet);
    TANDEM_CHECK(result.exit_code == 0, "the calibration's link timing failed: ", result.summary());
    const auto times = nlohmann::json::parse(read_regular_file(out, "the link timing's output"));
    std::filesystem::remove(out);
    return times.get<plan::LinkTimes>();
  };
  const auto cal = plan::calibrate(o, say, links);
  Table table({"micro-batch", "GFLOP", "measured s", "fitted s"});
  for (const auto& p : cal.points) {
    table.add_row({std::to_string(p.micro_batch), format("%.3f", p.flops / 1e9), format("%.4f", p.seconds),
                   format("%.4f", p.fitted)});
  }
  std::printf("%s", table.render().c_str());
  plan::write_profile(cal.profile, path);
  std::printf("wrote %s: plan with tandem plan --device %s\n", path.c_str(), path.c_str());
  return 0;
}

}  // namespace tandem::cli::internal
