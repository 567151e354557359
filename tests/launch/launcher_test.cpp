// `tandem launch`, run as a user runs it: the workers' environment, output
// prefixes, a failing or SIGKILLed worker ending the job in bounded time with
// no process left behind, restarts, signal forwarding, and the launcher
// itself being killed.
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
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::run_tandem;
using testing::TempDir;

// How many processes have `marker` in their command line. The pattern's
// first letter in brackets keeps the shell running pgrep from matching.
int count_processes(const std::string& marker) {
  std::string pattern = "^[" + marker.substr(0, 1) + "]" + marker.substr(1);
  auto r = run("pgrep -f -c -- '" + pattern + "' || true");
  return std::atoi(r.output.c_str());
}

// The pid of the one process whose command line matches `pattern` (a regex),
// waiting up to 5 s for it to appear; 0 if none.
pid_t pid_of(const std::string& pattern) {
  for (int i = 0; i < 50; ++i) {
    auto r = run("pgrep -f -- '" + pattern + "' || true");
    if (!r.output.empty()) return std::atoi(r.output.c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

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

TEST(LaunchTest, MaxRestartsRestartsEveryWorker) {
  TempDir dir;
  // Rank 0 fails on the first two attempts and succeeds on the third.
  std::string script = "echo x >> " + dir.path() + "/attempts.$RANK; echo attempt $TANDEM_RESTART_COUNT; "
                       "if [ $RANK = 0 ] && [ $TANDEM_RESTART_COUNT -lt 2 ]; then exit 1; fi; echo done";
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem("launch --nproc-per-node 2 --max-restarts 2 -- sh -c '" + script + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("exited with code 1; restarting all 2 workers (restart 1 of 2)"), std::string::npos)
      << r.output;
  // Note [restart back-off]: the same failure again, at once: said, and
  // the next restart waits a second.
  EXPECT_NE(r.output.find("exited with code 1; the same failure as the attempt before, within 60 s of its "
                          "start: restarting all 2 workers in 1 s (restart 2 of 2)"),
            std::string::npos)
      << r.output;
  EXPECT_GE(seconds_since(start), 1.0);
  EXPECT_NE(r.output.find("[rank 0] attempt 2\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 1] done\n"), std::string::npos) << r.output;
  EXPECT_EQ(testing::read_text(dir.file("attempts.0")), "x\nx\nx\n");

  auto fail = run_tandem("launch --nproc-per-node 1 --max-restarts 1 -- sh -c 'exit 5'");
  EXPECT_EQ(fail.exit_code, 1);
  EXPECT_NE(fail.output.find("exited with code 5 (after 1 restart)"), std::string::npos) << fail.output;
}

// Note [restart back-off]: a failure that repeats at start-up waits 1, 2,
// 4, ... s between restarts, each said to be the same; one that differs
// each time (the control: its code counts the restarts) restarts at once.
TEST(LaunchTest, AFailureThatRepeatsBacksOffAndIsSaidToBeTheSame) {
  auto start = std::chrono::steady_clock::now();
  auto same = run_tandem("launch --nproc-per-node 2 --max-restarts 3 -- sh -c 'echo no such file >&2; exit 3'");
  const double backed_off = seconds_since(start);
  EXPECT_EQ(same.exit_code, 1) << same.output;
  EXPECT_NE(same.output.find("the same failure as the attempt before, within 60 s of its start: restarting all 2 "
                             "workers in 1 s (restart 2 of 3)"),
            std::string::npos)
      << same.output;
  EXPECT_NE(same.output.find("the same failure as the 2 attempts before, each within 60 s of its start: restarting "
                             "all 2 workers in 2 s (restart 3 of 3)"),
            std::string::npos)
      << same.output;
  EXPECT_GE(backed_off, 3.0);
  start = std::chrono::steady_clock::now();
  auto differs = run_tandem("launch --nproc-per-node 2 --max-restarts 3 -- sh -c 'exit $((3 + TANDEM_RESTART_COUNT))'");
  EXPECT_EQ(differs.exit_code, 1) << differs.output;
  EXPECT_EQ(differs.output.find("the same failure"), std::string::npos) << differs.output;
  EXPECT_NE(differs.output.find("exited with code 6 (after 3 restarts)"), std::string::npos) << differs.output;
  EXPECT_LT(seconds_since(start), backed_off);
}

// Starts `tandem launch --nproc-per-node 2 -- sh -c 'exec sleep MARKER'` in
// the background, output to `out`, and waits until both workers run.
// Returns the launcher's pid, or 0 (a test failure recorded) if the launcher
// or its two workers did not appear.
pid_t start_sleeping_job(const std::string& marker, const std::string& out) {
  run(std::string(TANDEM_CLI) + " launch --nproc-per-node 2 -- sh -c 'exec sleep " + marker +
      "' > " + out + " 2>&1 &");
  pid_t launcher = pid_of("^[^ ]*tandem launch .*sleep " + marker);
  for (int i = 0; i < 50 && launcher > 0 && count_processes("sleep " + marker) < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(launcher, 0) << "no launcher for sleep " << marker;
  EXPECT_EQ(count_processes("sleep " + marker), 2) << "workers of sleep " << marker;
  return launcher > 0 && count_processes("sleep " + marker) == 2 ? launcher : 0;
}

// SIGTERM to the launcher reaches the workers; the launcher then exits with
// 128 + 15, and nothing is left.
TEST(LaunchTest, SigtermIsForwarded) {
  TempDir dir;
  const std::string marker = "61.75";
  pid_t launcher = start_sleeping_job(marker, dir.file("out"));
  ASSERT_GT(launcher, 0);
  kill(launcher, SIGTERM);
  for (int i = 0; i < 100 && kill(launcher, 0) == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_NE(kill(launcher, 0), 0) << "the launcher is still running";
  EXPECT_EQ(count_processes("sleep " + marker), 0);
  EXPECT_NE(testing::read_text(dir.file("out")).find("got SIGTERM, passing it to the workers"),
            std::string::npos);
}

// SIGHUP (the terminal or the ssh session gone) is passed on like SIGTERM,
// as torchrun does: the workers' own handlers run (they used to be killed
// by the launcher's death instead), and the launcher exits with 128 + 1.
TEST(LaunchTest, SighupIsPassedToTheWorkers) {
  TempDir dir;
  const std::string script = dir.file("hup-61.625.sh");
  std::ofstream(script) << "trap 'echo \"hup in $RANK\"; kill $child; exit 7' HUP\n"
                           "sleep 61.625 &\nchild=$!\nwait $child\n";
  run(std::string("(") + TANDEM_CLI + " launch --nproc-per-node 2 -- sh " + script + " > " + dir.file("out") +
      " 2>&1; echo $? > " + dir.file("rc") + ") > /dev/null 2>&1 &");
  pid_t launcher = pid_of("^[^ ]*tandem launch .*hup-61.625");
  ASSERT_GT(launcher, 0);
  for (int i = 0; i < 50 && count_processes("sleep 61.625") < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(count_processes("sleep 61.625"), 2);
  kill(launcher, SIGHUP);
  for (int i = 0; i < 100 && testing::read_text(dir.file("rc")).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::string out = testing::read_text(dir.file("out"));
  EXPECT_EQ(testing::read_text(dir.file("rc")), std::to_string(128 + SIGHUP) + "\n") << out;
  EXPECT_NE(out.find("tandem launch: got SIGHUP, passing it to the workers"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 0] hup in 0"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 1] hup in 1"), std::string::npos) << out;
  EXPECT_EQ(count_processes("sleep 61.625"), 0) << out;
}

// Even a launcher killed with SIGKILL leaves no worker behind.
TEST(LaunchTest, WorkersDieWithAKilledLauncher) {
  const std::string marker = "61.875";
  pid_t launcher = start_sleeping_job(marker, "/dev/null");
  ASSERT_GT(launcher, 0);
  kill(launcher, SIGKILL);
  for (int i = 0; i < 50 && count_processes("sleep " + marker) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

// Runs `tandem launch ARGS` with its output in `out`, after `prepare` ran in
// the child (before exec: it sets what the launcher inherits). Returns the
// exit status, or -1 if it did not end within `seconds` (then it is killed).
int launch_prepared(const std::vector<std::string>& args, const std::string& out,
                    const std::function<void()>& prepare, double seconds) {
  std::vector<std::string> argv_text{TANDEM_CLI, "launch"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    prepare();
    execv(argv[0], argv.data());
    _exit(127);
  }
  auto start = std::chrono::steady_clock::now();
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (seconds_since(start) > seconds) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return status;
}

// A stopped worker gets SIGCONT with its SIGTERM, so a failure elsewhere
// ends it at once rather than after --stop-grace (30 s here).
TEST(LaunchTest, AStoppedWorkerIsWokenToEnd) {
  auto start = std::chrono::steady_clock::now();
  auto r = run_tandem("launch --nproc-per-node 2 --stop-grace 30 -- sh -c "
                      "'if [ $RANK = 1 ]; then kill -STOP $$; fi; sleep 2; exit 3'");
  double took = seconds_since(start);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem launch: rank 0 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(") exited with code 3; stopping the other workers"), std::string::npos) << r.output;
  EXPECT_LT(took, 15) << r.output;
}

// A SIGTERM that reaches the launcher while it starts its workers stops the
// start there (a fork each: thousands take seconds) and is passed on. Here
// it is pending from the start: blocked and raised before exec, which keeps
// it pending; the launcher unblocks it, so it is not deaf to it either.
TEST(LaunchTest, ASignalWhileStartingStopsTheStart) {
  TempDir dir;
  const std::string marker = "62.125";
  int status = launch_prepared({"--nproc-per-node", "64", "--", "sleep", marker}, dir.file("out"),
                               [] {
                                 sigset_t term;
                                 sigemptyset(&term);
                                 sigaddset(&term, SIGTERM);
                                 sigprocmask(SIG_BLOCK, &term, nullptr);
                                 raise(SIGTERM);
                               },
                               20);
  std::string out = testing::read_text(dir.file("out"));
  ASSERT_NE(status, -1) << "the launcher did not end within 20 s:\n" << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << status << "\n" << out;
  EXPECT_NE(out.find("tandem launch: got SIGTERM while starting the workers (0 of 64 started)"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("stopped by SIGTERM while starting the workers (0 of 64 started)"),
            std::string::npos)
      << out;
  EXPECT_EQ(count_processes("sleep " + marker), 0);
}

// fork() refused for the third of three workers (the system out of
// processes; tests/launch/fork_fails.cpp preloaded): the launcher ends the
// two it started at once, names the rank and the reason, and exits 1.
TEST(LaunchTest, AForkFailureEndsTheStartedWorkers) {
  TempDir dir;
  const std::string marker = "61.375";
  auto start = std::chrono::steady_clock::now();
  int status = launch_prepared({"--nproc-per-node", "3", "--", "sleep", marker}, dir.file("out"),
                               [] {
                                 setenv("LD_PRELOAD", TANDEM_FORK_FAILS, 1);
                                 setenv("TANDEM_TEST_FAIL_FORK", "3", 1);
                               },
                               20);
  std::string out = testing::read_text(dir.file("out"));
  ASSERT_NE(status, -1) << "the launcher did not end within 20 s:\n" << out;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
  EXPECT_NE(out.find("launch: fork failed for rank 2 (2 of 3 workers started): Resource temporarily "
                     "unavailable"),
            std::string::npos)
      << out;
  EXPECT_LT(seconds_since(start), 10) << out;  // not after the workers' sleep of a minute
  EXPECT_EQ(count_processes("sleep " + marker), 0) << out;
}

// Two pipes per worker: the launcher raises its soft limit on open files
// as far as that takes (the workers get the limit it found), and refuses,
// naming the limit, when the hard limit is too low.
TEST(LaunchTest, OpenFileLimits) {
  TempDir dir;
  auto limit_files = [](rlim_t soft, rlim_t hard) {
    return [=] {
      rlimit l{soft, hard};
      setrlimit(RLIMIT_NOFILE, &l);
    };
  };
  int status = launch_prepared({"--nproc-per-node", "60", "--", "sh", "-c", "ulimit -n"}, dir.file("out"),
                               limit_files(100, 4096), 60);
  std::string out = testing::read_text(dir.file("out"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << out;
  for (int rank : {0, 59}) {
    EXPECT_NE(out.find("[rank " + std::to_string(rank) + "] 100\n"), std::string::npos) << out;
  }
  status = launch_prepared({"--nproc-per-node", "60", "--", "true"}, dir.file("out"),
                           limit_files(100, 100), 60);
  out = testing::read_text(dir.file("out"));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status << "\n" << out;
  EXPECT_NE(out.find("--nproc-per-node 60: the launcher keeps two pipes per worker, about "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("open files, but this process may open at most 100 (ulimit -Hn)"),
            std::string::npos)
      << out;
}

TEST(LaunchTest, UsageErrors) {
  auto r = run_tandem("launch --nproc-per-node 2");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("no command"), std::string::npos) << r.output;
  r = run_tandem("launch --nproc-per-node 0 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  r = run_tandem("launch --nproc-per-node 4097 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--nproc-per-node: expected at most 4096 workers on one node, got 4097"),
            std::string::npos)
      << r.output;
  r = run_tandem("launch --nproc-per-node 1 -- /no/such/program");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank 0] cannot run /no/such/program"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 127"), std::string::npos) << r.output;
  TempDir dir;
  r = run_tandem("launch --nproc-per-node 1 -- " + dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank 0] cannot run " + dir.path() + ": a directory, not a program"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("exited with code 126"), std::string::npos) << r.output;  // found, cannot run: a shell's 126
  std::ofstream(dir.file("not-executable")) << "true\n";
  r = run_tandem("launch --nproc-per-node 1 -- " + dir.file("not-executable"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("[rank 0] cannot run " + dir.file("not-executable") + ": Permission denied"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("exited with code 126"), std::string::npos) << r.output;
  r = run_tandem("launch --nproc-per-node 1 --master-port 65536 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--master-port: expected 0 to 65535 (0: a free one), got 65536"), std::string::npos)
      << r.output;
  // Multi-node options that cannot work (they exited 1).
  r = run_tandem("launch --nnodes 2 --node-rank 2 --master-port 29614 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--node-rank: expected 0..1, got 2"), std::string::npos) << r.output;
  r = run_tandem("launch --nnodes 2 --node-rank 0 -- true");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--master-port is required when --nnodes > 1"), std::string::npos) << r.output;
  r = run_tandem("launch --help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("--nproc-per-node N"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace tandem
