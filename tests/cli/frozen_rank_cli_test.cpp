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
#include <memory>
#include <vector>

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

// One job: a strategy over 2 ranks, or a mesh of 4 (gpt2-tiny), and the
// rank of it to freeze.
struct FrozenJob {
  std::string job;
  int frozen = 0;
  TempDir dir;
  int ranks = 2;
  pid_t victim = 0;
  std::chrono::steady_clock::time_point frozen_at;
  double seconds = -1;  // from the freeze to the job's end
};

std::string job_flags(const std::string& job, const TempDir& dir) {
  if (job == "mesh") {
    return "--nproc-per-node 4 --mesh pp=2,tp=2 --model gpt2-tiny --data text:" + testing::write_text(dir) +
           " --seq-len 16 --batch-size 16 --epochs 500";
  }
  testing::write_synthetic_idx(dir.path(), 4096, 64);
  return "--nproc-per-node 2 --strategy " + job + " --data idx:" + dir.path() + " --epochs 50 --batch-size 32";
}

// Each role: rank 0 and rank 1 under ddp, fsdp and a pipeline over ranks;
// rank 2 of pp=2 x tp=2, frozen in stage 1's tp all-reduce while stage 0
// waits for stage 1 in a recv (Note [a silent rank]), where a survivor's
// store printed c10d's stack trace when the job ended. The seven jobs run
// at once: a frozen job only waits, so each is frozen as soon as it trains
// and the bound is on each job's own end after its freeze.
TEST(FrozenRankCliTest, TheFrozenRankIsNamedWhateverItsRole) {
  std::vector<std::unique_ptr<FrozenJob>> jobs;
  auto add = [&jobs](const char* job, int frozen) {
    jobs.push_back(std::make_unique<FrozenJob>());
    jobs.back()->job = job;
    jobs.back()->frozen = frozen;
    jobs.back()->ranks = jobs.back()->job == "mesh" ? 4 : 2;
  };
  for (const char* job : {"ddp", "fsdp", "pipeline"}) {
    add(job, 0);
    add(job, 1);
  }
  add("mesh", 2);
  for (auto& j : jobs) {
    run("(" + std::string(TANDEM_CLI) + " train " + job_flags(j->job, j->dir) +
        " --dist-timeout 5 --progress lines > " + j->dir.file("out") + " 2>&1; echo $? > " + j->dir.file("rc") +
        ") > /dev/null 2>&1 &");
  }
  // Training runs (a loaded machine starts slowly: up to 2 minutes), then
  // the rank is frozen; each job then has 60 s to end.
  const auto started = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  for (bool waiting = true; waiting;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    waiting = false;
    for (auto& j : jobs) {
      if (j->victim == 0) {
        if (since(started) > 120) continue;  // never trained: reported below
        waiting = true;
        if (testing::read_text(j->dir.file("out")).find("epoch 1/") == std::string::npos) continue;
        j->victim = testing::worker_pid(j->dir.path(), j->frozen);  // the path is unique to the job's lines
        if (j->victim == 0) continue;
        j->frozen_at = std::chrono::steady_clock::now();
        ::kill(j->victim, SIGSTOP);
      } else if (j->seconds < 0) {
        if (!testing::read_text(j->dir.file("rc")).empty()) {
          j->seconds = since(j->frozen_at);
        } else if (since(j->frozen_at) < 60) {
          waiting = true;
        }
      }
    }
  }
  for (auto& j : jobs) {
    if (j->victim > 0) ::kill(j->victim, SIGCONT);  // were the launcher to have left it (it must not)
  }
  for (auto& j : jobs) {
    SCOPED_TRACE(j->job + ", rank " + std::to_string(j->frozen) + " frozen");
    const auto out = testing::read_text(j->dir.file("out"));
    if (j->victim == 0) {
      ADD_FAILURE() << "it never trained:\n" << out;
      run("pkill -KILL -f -- '^[^ ]*tandem train .*" + j->dir.path() + "' || true");
      continue;
    }
    EXPECT_EQ(testing::read_text(j->dir.file("rc")), "1\n") << out;
    // A 5 s timeout, the diagnosis' grace, the launcher's waits.
    EXPECT_TRUE(j->seconds >= 0 && j->seconds < 45) << j->seconds << " s\n" << out;
    std::printf("%s, rank %d frozen: the job ended %.1f s later\n", j->job.c_str(), j->frozen, j->seconds);
    const auto last = out.rfind("tandem launch: ");
    if (last == std::string::npos) {
      ADD_FAILURE() << out;
      continue;
    }
    const std::string verdict = out.substr(last);
    EXPECT_EQ(verdict.rfind("tandem launch: rank " + std::to_string(j->frozen) + " (pid " +
                                std::to_string(j->victim) +
                                ") stopped answering (it was stopped by SIGSTOP or a terminal's ^Z); rank ",
                            0),
              0u)
        << out;
    if (j->ranks == 2) {
      EXPECT_NE(verdict.find("; rank " + std::to_string(1 - j->frozen) + " (pid "), std::string::npos) << out;
    }
    // One line per failure: no library's stack trace (Note [library warnings]).
    EXPECT_EQ(out.find("frame #"), std::string::npos) << out;
    EXPECT_EQ(run("pgrep -f -- '^[^ ]*tandem train .*" + j->dir.path() + "' || true").output, "") << out;
  }
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

}  // namespace
}  // namespace tandem
