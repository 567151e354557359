// Note [temporaries on signals]: each case runs in a forked child, which
// the signal really ends.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "tandem/util/removed_on_signal.h"

namespace tandem {
namespace {

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Runs `body` in a child; returns its wait status.
int in_child(const std::function<void()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    body();
    std::_Exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

class RemovedOnSignalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tandem-removed-XXXXXX";
    const int fd = ::mkstemp(pattern);
    ASSERT_GE(fd, 0);
    ::close(fd);
    path_ = pattern;
  }
  void TearDown() override { ::unlink(path_.c_str()); }
  std::string path_;
};

TEST_F(RemovedOnSignalTest, ASignalRemovesThePathAndStillEndsTheProcess) {
  for (int signal : {SIGTERM, SIGINT, SIGHUP}) {
    std::FILE* again = std::fopen(path_.c_str(), "w");
    ASSERT_NE(again, nullptr);
    std::fclose(again);
    const int status = in_child([&] {
      RemovedOnSignal other("/tmp/tandem-removed-never-made");  // a second slot, absent: no harm
      RemovedOnSignal removed(path_);
      ::raise(signal);
    });
    ASSERT_TRUE(WIFSIGNALED(status)) << signal << ": status " << status;
    EXPECT_EQ(WTERMSIG(status), signal);
    EXPECT_FALSE(exists(path_)) << signal;
  }
}

TEST_F(RemovedOnSignalTest, APathNoLongerHeldIsKept) {
  const int status = in_child([&] {
    { RemovedOnSignal removed(path_); }
    ::raise(SIGTERM);
  });
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  EXPECT_TRUE(exists(path_));
}

TEST_F(RemovedOnSignalTest, AProgramsOwnDispositionIsLeftAlone) {
  const int status = in_child([&] {
    ::signal(SIGTERM, SIG_IGN);
    RemovedOnSignal removed(path_);
    ::raise(SIGTERM);  // ignored, as the program asked
  });
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_TRUE(exists(path_));
}

}  // namespace
}  // namespace tandem
