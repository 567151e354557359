// A rank that stops answering (frozen by SIGSTOP) is the one named, whatever
// its role: rank 0, whose process serves the job's store (so the diagnosis
// cannot ask it), included; under DDP, FSDP and a pipeline over ranks
// (Note [who did not come], Note [first failure]). The job ends in bounded
// time, with no process left.
#include <signal.h>

#include <chrono>
#include <string>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::TempDir;

class FrozenRankCliTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(FrozenRankCliTest, TheFrozenRankIsNamed) {
  const auto [strategy, frozen] = GetParam();
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 4096, 64);
  const std::string marker = dir.path();  // unique to this job's command lines
  run("(" + std::string(TANDEM_CLI) + " train --nproc-per-node 2 --strategy " + strategy + " --data idx:" +
      dir.path() + " --epochs 50 --batch-size 32 --dist-timeout 5 --progress lines > " + dir.file("out") +
      " 2>&1; echo $? > " + dir.file("rc") + ") > /dev/null 2>&1 &");
  // Training runs (a loaded machine starts slowly: up to 2 minutes), then
  // the rank is frozen; the bound is on the end after that.
  pid_t victim = 0;
  for (int i = 0; i < 1200 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (testing::read_text(dir.file("out")).find("epoch 1/50") == std::string::npos) continue;
    victim = testing::worker_pid(marker, frozen);
  }
  ASSERT_GT(victim, 0) << testing::read_text(dir.file("out"));
  const auto frozen_at = std::chrono::steady_clock::now();
  ::kill(victim, SIGSTOP);
  for (int i = 0; i < 600 && testing::read_text(dir.file("rc")).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - frozen_at).count();
  ::kill(victim, SIGCONT);  // were the launcher to have left it (it must not)
  const auto out = testing::read_text(dir.file("out"));
  EXPECT_EQ(testing::read_text(dir.file("rc")), "1\n") << out;
  EXPECT_LT(seconds, 45) << out;  // a 5 s timeout, the diagnosis' grace, the launcher's waits
  std::printf("%s, rank %d frozen: the job ended %.1f s later\n", strategy, frozen, seconds);
  const auto last = out.rfind("tandem launch: ");
  ASSERT_NE(last, std::string::npos) << out;
  const std::string verdict = out.substr(last);
  EXPECT_EQ(verdict.rfind("tandem launch: rank " + std::to_string(frozen) + " (pid " + std::to_string(victim) +
                              ") stopped answering (it was stopped by SIGSTOP or a terminal's ^Z); rank " +
                              std::to_string(1 - frozen) + " (pid ",
                          0),
            0u)
      << out;
  EXPECT_EQ(run("pgrep -f -- '^[^ ]*tandem train .*" + marker + "' || true").output, "") << out;
}

std::string test_name(const ::testing::TestParamInfo<FrozenRankCliTest::ParamType>& info) {
  return std::string(std::get<0>(info.param)) + "_rank" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EachRoleEachRank, FrozenRankCliTest,
                         ::testing::Combine(::testing::Values("ddp", "fsdp", "pipeline"), ::testing::Values(0, 1)),
                         test_name);

}  // namespace
}  // namespace tandem
