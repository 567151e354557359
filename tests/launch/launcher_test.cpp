// `tandem launch`, run as a user runs it: the workers' environment and
// output prefixes, and a failing or SIGKILLed worker ending the job in
// bounded time, named as the cause (lifecycle: launcher_lifecycle_test.cpp).
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tandem/launch/worker_error.h"
#include "launch_fixture.h"

namespace tandem {
namespace {

using namespace launch_test;

TEST(LaunchTest, WorkersGetTorchrunsEnvironmentAndPrefixedOutput) {
  // OMP_NUM_THREADS unset: the launcher leaves a set one alone (next test),
  // and a test runner may set it (scripts/gpu-check does).
  auto r = run(
      "env -u OMP_NUM_THREADS " + std::string(TANDEM_CLI) + " launch --nproc-per-node 3 -- sh -c "
      "'echo \"env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$MASTER_ADDR/$OMP_NUM_THREADS\"; "
      "echo \"port $MASTER_PORT\"; echo \"to stderr $RANK\" >&2'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int threads = std::max(cores / 3, 1);
  for (int rank = 0; rank < 3; ++rank) {
    std::string line = "[rank " + std::to_string(rank) + "] env " + std::to_string(rank) + "/3/" +
                       std::to_string(rank) + "/3/127.0.0.1/" + std::to_string(threads) + "\n";
    EXPECT_NE(r.output.find(line), std::string::npos) << line << "in:\n" << r.output;
    EXPECT_NE(r.output.find("[rank " + std::to_string(rank) + "] to stderr " + std::to_string(rank)),
              std::string::npos);
  }
  // One free port, the same for every rank.
  auto first = r.output.find("] port ");
  ASSERT_NE(first, std::string::npos);
  std::string port = r.output.substr(first + 7, r.output.find('\n', first) - first - 7);
  EXPECT_GT(std::atoi(port.c_str()), 0);
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 9) << r.output;
  size_t at = 0;
  int same = 0;
  while ((at = r.output.find("] port " + port + "\n", at)) != std::string::npos) ++same, ++at;
  EXPECT_EQ(same, 3) << r.output;
}

// Note [job token]: every worker of a single-node job gets the same fresh
// random token (a new one per job); --job-token sets it.
// A worker's bytes come through as they are, NULs included (they used to
// cut the line), and a line without a newline goes out in prefixed pieces
// of 1 MiB, so the launcher's memory stays bounded.
TEST(LaunchTest, OutputKeepsEveryByteAndLongLinesComeInPieces) {
  auto r = run_tandem("launch --nproc-per-node 1 -- sh -c "
                      "'printf \"a\\0b\\n\"; head -c 2500000 /dev/zero | tr \"\\0\" x; printf \"c\\0d\"'");
  ASSERT_EQ(r.exit_code, 0) << r.output.substr(0, 200);
  const std::string mib(size_t{1} << 20, 'x');
  const std::string expected = std::string("[rank 0] a\0b\n", 13) + "[rank 0] " + mib + "\n[rank 0] " + mib +
                               "\n[rank 0] " + std::string(2500000 - 2 * mib.size(), 'x') + std::string("c\0d\n", 4);
  EXPECT_EQ(r.output.size(), expected.size());
  EXPECT_TRUE(r.output == expected) << r.output.substr(0, 40);
}

TEST(LaunchTest, WorkersShareAJobToken) {
  auto tokens_of = [](const std::string& flags) {
    auto r = run_tandem("launch --nproc-per-node 2 " + flags + " -- sh -c 'echo token $TANDEM_JOB_TOKEN'");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<std::string> tokens;
    for (int rank = 0; rank < 2; ++rank) {
      std::string prefix = "[rank " + std::to_string(rank) + "] token ";
      auto at = r.output.find(prefix);
      EXPECT_NE(at, std::string::npos) << r.output;
      if (at != std::string::npos) {
        at += prefix.size();
        tokens.push_back(r.output.substr(at, r.output.find('\n', at) - at));
      }
    }
    return tokens;
  };
  auto first = tokens_of(""), second = tokens_of("");
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(first[0], first[1]);
  EXPECT_EQ(first[0].size(), 32u);
  EXPECT_EQ(first[0].find_first_not_of("0123456789abcdef"), std::string::npos) << first[0];
  EXPECT_NE(first[0], second[0]) << "two jobs got the same token";
  EXPECT_EQ(tokens_of("--job-token s3cret"), (std::vector<std::string>{"s3cret", "s3cret"}));
}

TEST(LaunchTest, OmpThreadsAreLeftAloneWhenSet) {
  auto r = run("OMP_NUM_THREADS=7 " + std::string(TANDEM_CLI) +
               " launch --nproc-per-node 2 -- sh -c 'echo omp $OMP_NUM_THREADS' 2>&1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[rank 1] omp 7"), std::string::npos) << r.output;
}

TEST(LaunchTest, AFailingWorkerStopsTheOthersAndIsNamed) {
  const std::string marker = "61.25";
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem("launch --nproc-per-node 3 -- sh -c "
                      "'if [ $RANK = 1 ]; then sleep 0.5; exit 3; fi; exec sleep " + marker + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds_since(start), 15);
  EXPECT_NE(r.output.find("tandem launch: rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 3"), std::string::npos) << r.output;
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

TEST(LaunchTest, ASigkilledWorkerIsNamedWithinSeconds) {
  const std::string marker = "61.5";
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem("launch --nproc-per-node 2 --stop-grace 2 -- sh -c "
                      "'if [ $RANK = 1 ]; then sleep 0.5; kill -9 $$; fi; "
                      "trap \"\" TERM; sleep " + marker + "'");  // rank 0 ignores SIGTERM
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds_since(start), 30);
  EXPECT_NE(r.output.find("rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 9 (SIGKILL)"), std::string::npos) << r.output;
  EXPECT_EQ(count_processes("sleep " + marker), 0) << "a worker outlived the launcher";
}

// Note [first failure]: rank 0 fails first, with an error of its own, but
// is slow to end (a second); rank 1, whose collective lost it, reports later
// and exits first. The launcher names rank 0 and its message, not the first
// exit it saw, and still ends the job (rank 2 never ends by itself).
TEST(LaunchTest, TheRankThatFailedFirstIsNamedNotTheFirstToExit) {
  const std::string marker = "63.125";
  const std::string report = TANDEM_REPORT_ERROR;
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem(
      "launch --nproc-per-node 3 -- sh -c '"
      "if [ $RANK = 0 ]; then " + report + " own \"cannot write the checkpoint\"; sleep 1; exit 4; fi; "
      "if [ $RANK = 1 ]; then sleep 0.3; " + report + " peer \"all_reduce on rank 1 of 3 (gloo) failed\"; "
      "exit 1; fi; exec sleep " + marker + "'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds_since(start), 15);
  EXPECT_NE(r.output.find("tandem launch: rank 0 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 4: cannot write the checkpoint\n"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("tandem launch: rank 1 (pid "), std::string::npos) << r.output;
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

// A rank that reported its own error first but had not exited when another
// rank's failure made the launcher stop the job: it is named for its error,
// and its end is not put down to the launcher's own SIGTERM.
TEST(LaunchTest, ARankStoppedAfterItsErrorIsNamedForTheError) {
  const std::string marker = "63.375";
  const std::string report = TANDEM_REPORT_ERROR;
  auto r = run_tandem(
      "launch --nproc-per-node 2 -- sh -c '"
      "if [ $RANK = 0 ]; then " + report + " own \"cannot resume from ckpt\"; exec sleep " + marker + "; fi; "
      "sleep 0.5; exec " + report + " own \"cannot resume either\"'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem launch: rank 1 (pid "), std::string::npos) << r.output;  // the first to exit
  const auto last = r.output.rfind("tandem launch: rank 0 (pid ");
  ASSERT_NE(last, std::string::npos) << r.output;
  EXPECT_NE(r.output.find(") failed, and the launcher stopped it with SIGTERM before it exited: cannot resume from "
                          "ckpt\n",
                          last),
            std::string::npos)
      << r.output;
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

// When every failure followed a peer's (the peer itself never said why),
// the earliest report is named, not the earliest exit, and the launcher
// waits no longer than launch::kPeerFailureWait for a better one.
TEST(LaunchTest, AmongFailuresThatFollowedAPeerTheEarliestIsNamed) {
  const std::string marker = "63.25";
  const std::string report = TANDEM_REPORT_ERROR;
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem(
      "launch --nproc-per-node 3 -- sh -c '"
      "if [ $RANK = 1 ]; then sleep 0.2; " + report + " peer \"recv on rank 1 timed out\"; sleep 1; exit 1; fi; "
      "if [ $RANK = 0 ]; then sleep 0.6; " + report + " peer \"all_reduce on rank 0 closed\"; exit 1; fi; "
      "exec sleep " + marker + "'");
  const double seconds = seconds_since(start);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_LT(seconds, 12);
  EXPECT_GT(seconds, 3.4) << "it stopped rank 2 before the wait for rank 0's peer ended";
  EXPECT_NE(r.output.find("exited with code 1: recv on rank 1 timed out\n"), std::string::npos) << r.output;
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

// Note [first failure], continued: a rank that stopped answering (frozen
// by SIGSTOP) writes no error and never exits; the rank that waited for it
// reports a failure that followed a peer and names it. The launcher names
// the frozen rank, with what its process was doing, not the one that
// waited; a rank the report does not name is not blamed (the control).
TEST(LaunchTest, ARankNamedAsNotAnsweringIsNamedWithItsState) {
  const std::string report = TANDEM_REPORT_ERROR;
  for (const std::string named : {"0", "2"}) {
    auto start = std::chrono::steady_clock::now();
    auto r = run_tandem(
        "launch --nproc-per-node 2 -- sh -c '"
        "if [ $RANK = 0 ]; then kill -STOP $$; exec sleep 63.5; fi; "
        "sleep 0.3; exec " + report + " peer \"all_reduce on rank 1 of 2 (gloo) failed: timed out\" " + named + "'");
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_LT(seconds_since(start), 15) << r.output;
    const auto last = r.output.rfind("tandem launch: ");
    ASSERT_NE(last, std::string::npos) << r.output;
    const std::string line = r.output.substr(last);
    if (named == "0") {
      EXPECT_EQ(line.rfind("tandem launch: rank 0 (pid ", 0), 0u) << r.output;
      EXPECT_NE(line.find(") stopped answering (it was stopped by SIGSTOP or a terminal's ^Z); rank 1 (pid "),
                std::string::npos)
          << r.output;
      EXPECT_NE(line.find("), which waited for it, reported: all_reduce on rank 1 of 2 (gloo) failed: timed out"),
                std::string::npos)
          << r.output;
    } else {  // rank 2 is no worker of this launcher's: said as such
      EXPECT_EQ(line.rfind("tandem launch: rank 2 (on another node) stopped answering; rank 1 (pid ", 0), 0u)
          << r.output;
    }
    EXPECT_EQ(count_processes("sleep 63.5"), 0);
  }
}

// What a failing tandem leaves for its launcher, and what the launcher
// takes from such a file.
TEST(LaunchTest, WorkerErrorFilesRoundTripAndJunkIsNone) {
  launch::WorkerError error{123456789, true, {0, 3}, "all_reduce failed\nsecond line"};
  auto back = launch::parse_worker_error(launch::format_worker_error(error));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->time_ns, 123456789);
  EXPECT_TRUE(back->follows_peer);
  EXPECT_EQ(back->unanswered, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(back->message, "all_reduce failed\nsecond line");
  // The first version's files, without the unanswered ranks, still read.
  back = launch::parse_worker_error("tandem-worker-error 1\ntime_ns 5\nfollows_peer 1\nrecv failed");
  ASSERT_TRUE(back.has_value());
  EXPECT_TRUE(back->unanswered.empty());
  EXPECT_EQ(back->message, "recv failed");
  for (const char* junk : {"", "tandem-worker-error 1\ntime_ns 12", "tandem-worker-error 2\ntime_ns 1\nfollows_peer 0\nx",
                           "tandem-worker-error 1\ntime_ns x\nfollows_peer 0\n", "tandem-worker-error 1\ntime_ns 1\nfollows_peer 2\n",
                           "tandem-worker-error 2\ntime_ns 1\nfollows_peer 1\nunanswered 0 x\nm"}) {
    EXPECT_FALSE(launch::parse_worker_error(junk).has_value()) << junk;
  }
  TempDir dir;
  const std::string file = dir.file("rank-0");
  ::setenv(launch::kErrorFileVariable, file.c_str(), 1);
  launch::report_worker_error("cannot read data/x.png", false);
  ::unsetenv(launch::kErrorFileVariable);
  auto read = launch::read_worker_error(file);
  ASSERT_TRUE(read.has_value());
  EXPECT_FALSE(read->follows_peer);
  EXPECT_EQ(read->message, "cannot read data/x.png");
  const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
  EXPECT_LE(read->time_ns, now);
  EXPECT_GT(read->time_ns, now - int64_t{10'000'000'000});
  EXPECT_FALSE(launch::read_worker_error(dir.file("none")).has_value());

  // torchrun's file (Note [torchelastic error file]): PyTorch's ErrorHandler
  // format; a failure that followed a peer a second later.
  EXPECT_EQ(launch::torchelastic_error_json("a \"quoted\" name", false, 1000),
            "{\"message\":{\"extraInfo\":{\"py_callstack\":\"a \\\"quoted\\\" name\",\"timestamp\":\"1000\"},"
            "\"message\":\"a \\\"quoted\\\" name\"}}");
  EXPECT_EQ(launch::torchelastic_error_json("recv failed", true, 1000),
            "{\"message\":{\"extraInfo\":{\"py_callstack\":\"recv failed\",\"timestamp\":\"1001\"},"
            "\"message\":\"recv failed\"}}");
  const std::string elastic = dir.file("error.json");
  ::setenv(launch::kTorchelasticErrorFileVariable, elastic.c_str(), 1);
  launch::report_worker_error("cannot read data/x.png", false);
  ::unsetenv(launch::kTorchelasticErrorFileVariable);
  EXPECT_NE(testing::read_text(elastic).find("\"message\":\"cannot read data/x.png\"}}"),
            std::string::npos) << testing::read_text(elastic);
}

}  // namespace
}  // namespace tandem
