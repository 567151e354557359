// A rank that stops answering (frozen by SIGSTOP) is the one named, whatever
// its role: rank 0, whose process serves the job's store (so the diagnosis
// cannot ask it), included; under DDP, FSDP, a pipeline over ranks and a
// pp x tp mesh (Note [who did not come], Note [first failure], Note [a
// silent rank]). The job ends in bounded time, with no process left, and
// says so in its own lines, without a library's stack trace.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <tuple>

#include <gtest/gtest.h>

#include <c10/util/Logging.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "tandem/cli/commands.h"

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::TempDir;

class FrozenRankCliTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

// The jobs: a strategy over 2 ranks, or a mesh of 4 (gpt2-tiny).
std::string job_flags(const std::string& job, const TempDir& dir) {
  if (job == "mesh") {
    return "--nproc-per-node 4 --mesh pp=2,tp=2 --model gpt2-tiny --data text:" + testing::write_text(dir) +
           " --seq-len 16 --batch-size 16 --epochs 500";
  }
  testing::write_synthetic_idx(dir.path(), 4096, 64);
  return "--nproc-per-node 2 --strategy " + job + " --data idx:" + dir.path() + " --epochs 50 --batch-size 32";
}

TEST_P(FrozenRankCliTest, TheFrozenRankIsNamed) {
  const auto [job, frozen] = GetParam();
  TempDir dir;
  const std::string flags = job_flags(job, dir);
  const int ranks = std::string(job) == "mesh" ? 4 : 2;
  const std::string marker = dir.path();  // unique to this job's command lines
  run("(" + std::string(TANDEM_CLI) + " train " + flags + " --dist-timeout 5 --progress lines > " + dir.file("out") +
      " 2>&1; echo $? > " + dir.file("rc") + ") > /dev/null 2>&1 &");
  // Training runs (a loaded machine starts slowly: up to 2 minutes), then
  // the rank is frozen; the bound is on the end after that.
  pid_t victim = 0;
  for (int i = 0; i < 1200 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (testing::read_text(dir.file("out")).find("epoch 1/") == std::string::npos) continue;
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
  std::printf("%s, rank %d frozen: the job ended %.1f s later\n", job, frozen, seconds);
  const auto last = out.rfind("tandem launch: ");
  ASSERT_NE(last, std::string::npos) << out;
  const std::string verdict = out.substr(last);
  EXPECT_EQ(verdict.rfind("tandem launch: rank " + std::to_string(frozen) + " (pid " + std::to_string(victim) +
                              ") stopped answering (it was stopped by SIGSTOP or a terminal's ^Z); rank ",
                          0),
            0u)
      << out;
  if (ranks == 2) EXPECT_NE(verdict.find("; rank " + std::to_string(1 - frozen) + " (pid "), std::string::npos) << out;
  // One line per failure: no library's stack trace (Note [library warnings]).
  EXPECT_EQ(out.find("frame #"), std::string::npos) << out;
  EXPECT_EQ(run("pgrep -f -- '^[^ ]*tandem train .*" + marker + "' || true").output, "") << out;
}

// Note [library warnings]: a request to a store whose server has gone (rank
// 0's process ended) fails in c10d with a warning that carries its C++
// stack; after quiet_library_logs(), as the CLI runs, none of it reaches
// stderr. The control: before it, the frames are printed.
TEST(LibraryLogTest, AFailedStoreRequestPrintsNoStackTrace) {
  auto failed_request_output = [] {
    c10d::TCPStoreOptions server_options;
    server_options.port = 0;
    server_options.isServer = true;
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", server_options);
    c10d::TCPStoreOptions client_options;
    client_options.port = server->getPort();
    client_options.timeout = std::chrono::seconds(2);
    auto client = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", client_options);
    client->set("key", std::vector<uint8_t>{1});
    server.reset();  // its process ended
    TempDir dir;
    std::fflush(stderr);
    const int saved = ::dup(2), file = ::open(dir.file("err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(file, 2);
    try {
      client->check({"key"});
    } catch (const std::exception&) {
    }
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    ::close(file);
    return testing::read_text(dir.file("err"));
  };
  const int level = FLAGS_caffe2_log_level;
  const auto loud = failed_request_output();
  cli::quiet_library_logs();
  const auto quiet = failed_request_output();
  FLAGS_caffe2_log_level = level;
  EXPECT_NE(loud.find("frame #"), std::string::npos) << "the control: c10d logs no stack here any more:\n" << loud;
  EXPECT_EQ(quiet.find("frame #"), std::string::npos) << quiet;
}

std::string test_name(const ::testing::TestParamInfo<FrozenRankCliTest::ParamType>& info) {
  return std::string(std::get<0>(info.param)) + "_rank" + std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(EachRoleEachRank, FrozenRankCliTest,
                         ::testing::Combine(::testing::Values("ddp", "fsdp", "pipeline"), ::testing::Values(0, 1)),
                         test_name);
// pp=2 x tp=2: rank 2 frozen in stage 1's tp all-reduce; stage 0 waits for
// stage 1 in a recv (Note [a silent rank]), and a survivor's store printed
// c10d's stack trace when the job ended.
INSTANTIATE_TEST_SUITE_P(AMesh, FrozenRankCliTest, ::testing::Values(std::make_tuple("mesh", 2)), test_name);

}  // namespace
}  // namespace tandem
