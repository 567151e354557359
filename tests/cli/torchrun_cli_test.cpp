// Workers under the real torchrun, the one of the pinned torch wheel in the
// test venv (Note [agent store] in tandem/dist/rendezvous.h): its agent
// serves the store on MASTER_PORT and every worker joins it as a client.
// The weights equal those of the same job under tandem's own launcher, with
// torchrun's default (static) rendezvous, its c10d rendezvous, --standalone,
// and after a worker killed mid-run that torchrun restarts (--max-restarts
// 1), the workers resuming from the newest checkpoint.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "tandem/dist/process_group.h"
#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::TempDir;

std::string torchrun() {
  const std::string python = TANDEM_PYTHON;
  return python.substr(0, python.rfind('/') + 1) + "torchrun";
}

class TorchrunCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    testing::write_synthetic_idx(data_->path(), 1024, 64);
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  // The job's flags; its weights go to `weights`, its checkpoints (if
  // `checkpoints`) there.
  static std::string job(const std::string& weights, const std::string& checkpoints = "") {
    return " train --data idx:" + data_->path() + " --model convnet --epochs 2 --batch-size 32 --lr 0.05 --seed 7"
           " --progress lines --export-weights " + weights +
           (checkpoints.empty() ? "" : " --checkpoint-every 5 --checkpoint-dir " + checkpoints);
  }
  // The reference: the job under tandem's launcher.
  static std::string reference_weights() {
    static std::string weights;
    if (weights.empty()) {
      const std::string path = data_->file("reference.safetensors");
      auto r = testing::run_tandem(job(path) + " --nproc-per-node 2");
      EXPECT_EQ(r.exit_code, 0) << r.output;
      weights = testing::read_text(path);
    }
    return weights;
  }
  static TempDir* data_;
};
TempDir* TorchrunCliTest::data_ = nullptr;

TEST_F(TorchrunCliTest, TheRendezvousFormsGiveTandemLaunchsWeights) {
  ASSERT_EQ(::access(torchrun().c_str(), X_OK), 0) << torchrun() << " is not there: the test venv lacks torchrun";
  const std::string want = reference_weights();
  ASSERT_FALSE(want.empty());
  TempDir out;
  const int port = dist::pick_free_port("127.0.0.1");
  const std::string port_text = std::to_string(port);
  const struct {
    const char* name;
    std::string flags;
  } forms[] = {
      {"static", "--master-addr 127.0.0.1 --master-port " + port_text},
      {"c10d", "--rdzv-backend c10d --rdzv-endpoint 127.0.0.1:" + port_text + " --rdzv-id tandem-test"},
      {"standalone", "--standalone"},
  };
  for (const auto& form : forms) {
    const std::string weights = out.file(std::string(form.name) + ".safetensors");
    auto r = run(torchrun() + " " + form.flags + " --nproc-per-node 2 --no-python " + TANDEM_CLI + job(weights));
    EXPECT_EQ(r.exit_code, 0) << form.name << "\n" << r.output;
    EXPECT_EQ(r.output.find("already in use"), std::string::npos) << r.output;
    EXPECT_TRUE(testing::read_text(weights) == want) << form.name << ": the weights differ from tandem launch's\n"
                                                     << r.output;
  }
}

// --mesh auto is chosen by tandem train's own launcher: under torchrun
// each worker refuses it at once, before a rendezvous that would wait for
// its peers (it hung there once), and torchrun ends with the reason.
TEST_F(TorchrunCliTest, MeshAutoIsRefusedAtOnce) {
  ASSERT_EQ(::access(torchrun().c_str(), X_OK), 0) << torchrun() << " is not there";
  TempDir out;
  auto r = run("timeout 120 " + torchrun() + " --standalone --nproc-per-node 2 --no-python " + TANDEM_CLI +
               " train --model llama-tiny --data text:" + testing::write_text(out) +
               " --seq-len 16 --max-steps 1 --progress off --mesh auto");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "torchrun did not end\n" << r.output;
  EXPECT_NE(r.output.find("--mesh auto is chosen by tandem train's own launcher"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("of a job another launcher started"), std::string::npos) << r.output;
}

TEST_F(TorchrunCliTest, AKilledWorkerIsRestartedAndTheJobEndsWithTheSameWeights) {
  ASSERT_EQ(::access(torchrun().c_str(), X_OK), 0) << torchrun() << " is not there";
  const std::string want = reference_weights();
  ASSERT_FALSE(want.empty());
  TempDir out;
  const std::string checkpoints = out.file("ckpt");
  const std::string command = torchrun() + " --master-port " + std::to_string(dist::pick_free_port("127.0.0.1")) +
                              " --nproc-per-node 2 --max-restarts 1 --no-python " + TANDEM_CLI +
                              job(out.file("restarted.safetensors"), checkpoints);
  run("(" + command + " > " + out.file("out") + " 2>&1; echo $? > " + out.file("rc") + ") > /dev/null 2>&1 &");
  pid_t victim = 0;
  for (int i = 0; i < 3000 && victim == 0; ++i) {  // once the first checkpoint exists
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (testing::finished_checkpoints(checkpoints) == 0) continue;
    victim = testing::worker_pid(checkpoints, 1);
  }
  ASSERT_GT(victim, 0) << testing::read_text(out.file("out"));
  ::kill(victim, SIGKILL);
  for (int i = 0; i < 1800 && testing::read_text(out.file("rc")).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto output = testing::read_text(out.file("out"));
  EXPECT_EQ(testing::read_text(out.file("rc")), "0\n") << output;
  EXPECT_NE(output.find("restart 1: resuming from the newest checkpoint"), std::string::npos) << output;
  EXPECT_TRUE(testing::read_text(out.file("restarted.safetensors")) == want)
      << "the restarted job's weights differ from the uninterrupted one's\n" << output;
}

// Note [torchelastic error file]: rank 1 fails of its own (its export's
// folder is missing) and rank 0 then loses it in a collective; torchrun's
// summary names rank 1, with tandem's message, as the root cause. Stamped
// in the same second, the failure that followed would have been named
// (rank 0, the lower rank, in 4 of 4 runs).
TEST_F(TorchrunCliTest, TheRankThatFailedOfItsOwnIsTorchrunsRootCause) {
  ASSERT_EQ(::access(torchrun().c_str(), X_OK), 0) << torchrun() << " is not there";
  TempDir out;
  ASSERT_EQ(::mkdir(out.file("r0").c_str(), 0755), 0);
  auto r = run(torchrun() + " --master-port " + std::to_string(dist::pick_free_port("127.0.0.1")) +
               " --nproc-per-node 2 --no-python " + TANDEM_CLI + " train --data idx:" + data_->path() +
               " --model convnet --epochs 1 --batch-size 32 --progress off --export-weights " +
               out.file("r{rank}/w.safetensors"));
  EXPECT_NE(r.exit_code, 0) << r.output;
  const auto cause = r.output.find("Root Cause (first observed failure):");
  ASSERT_NE(cause, std::string::npos) << r.output;
  const std::string root = r.output.substr(cause);
  EXPECT_NE(root.find("rank      : 1 (local_rank: 1)"), std::string::npos) << root;
  EXPECT_NE(root.find("traceback : --export-weights " + out.file("r1/w.safetensors") + ": " + out.file("r1") +
                      " is not a folder this process can write to"),
            std::string::npos) << root;
}

}  // namespace
}  // namespace tandem
