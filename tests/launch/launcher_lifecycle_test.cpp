// `tandem launch`'s life cycle: restarts, signal forwarding, the launcher
// itself being killed, failures to start, file limits and usage errors.
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
