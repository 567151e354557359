// Multi-node over real network hosts: two network namespaces joined by a
// veth pair stand in for two machines (CTest label `netns`; creating them
// needs root, which these machines give: the test fails, not skips, without
// it). Each host runs `tandem launch --nnodes 2 --node-rank R
// --nproc-per-node 2`; the master is the first host's address.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <regex>
#include <sstream>
#include <string>

#include "tandem/dist/process_group.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::TempDir;

// Two namespaces, host A at 10.231.N.1 and host B at 10.231.N.2, removed
// (with their veth pair) when this goes, even after a failure.
class TwoHosts {
 public:
  TwoHosts() {
    const auto id = std::to_string(::getpid() % 100000);
    a_ = "tandem-a-" + id;
    b_ = "tandem-b-" + id;
    subnet_ = "10.231." + std::to_string(::getpid() % 250) + ".";
    auto r = run("set -e; ip netns add " + a_ + "; ip netns add " + b_ +
                 "; ip link add va" + id + " netns " + a_ + " type veth peer name vb" + id +
                 " netns " + b_ + "; ip -n " + a_ + " addr add " + address_a() + "/24 dev va" + id +
                 "; ip -n " + b_ + " addr add " + address_b() + "/24 dev vb" + id +
                 "; for n in " + a_ + " " + b_ + "; do ip -n $n link set lo up; done; ip -n " + a_ +
                 " link set va" + id + " up; ip -n " + b_ + " link set vb" + id + " up 2>&1");
    ok_ = r.exit_code == 0;
    error_ = r.output;
    link_a_ = "va" + id;
  }
  ~TwoHosts() { run("ip netns del " + a_ + " 2>/dev/null; ip netns del " + b_ + " 2>/dev/null"); }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  std::string address_a() const { return subnet_ + "1"; }
  std::string address_b() const { return subnet_ + "2"; }
  std::string on_a(const std::string& command) const { return "ip netns exec " + a_ + " " + command; }
  std::string on_b(const std::string& command) const { return "ip netns exec " + b_ + " " + command; }
  std::string cut_link() const { return "ip -n " + a_ + " link set " + link_a_ + " down"; }

 private:
  std::string a_, b_, subnet_, link_a_, error_;
  bool ok_ = false;
};

std::string launch_on(const TwoHosts& hosts, int node, int port, const std::string& train) {
  std::string launch = std::string(TANDEM_CLI) + " launch --nnodes 2 --node-rank " +
                       std::to_string(node) + " --nproc-per-node 2 --master-addr " +
                       hosts.address_a() + " --master-port " + std::to_string(port) +
                       " --job-token netns-test -- " + TANDEM_CLI + " " + train;
  return node == 0 ? hosts.on_a(launch) : hosts.on_b(launch);
}

// A shell fragment that starts the job on both hosts in the background,
// each launcher's output in DIR/a.log or b.log and its exit status, once it
// ends, in DIR/a.rc or b.rc.
std::string start_on_both(const TwoHosts& hosts, int port, const std::string& train,
                          const TempDir& dir) {
  std::string shell;
  for (int node : {0, 1}) {
    std::string host = node == 0 ? "a" : "b";
    shell += "(" + launch_on(hosts, node, port, train) + " > " + dir.file(host + ".log") +
             " 2>&1; echo $? > " + dir.file(host + ".rc") + ") > /dev/null 2>&1 & ";
  }
  return shell;
}

// Four ranks on two hosts end with the same weights, each equal (byte for
// byte) to those of the same job's four ranks on one host.
TEST(NetnsTest, TwoHostsTrainLikeOne) {
  TwoHosts hosts;
  ASSERT_TRUE(hosts.ok()) << "creating network namespaces needs root and iproute2: " << hosts.error();
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 128);
  std::string train = "train --data idx:" + dir.path() +
                      " --model mlp --batch-size 64 --epochs 1 --max-steps 6 --progress off "
                      "--dist-timeout 60 --export-weights " + dir.path();
  const int port = dist::pick_free_port();
  run(start_on_both(hosts, port, train + "/two-{rank}.st", dir) + "wait");
  auto log_a = testing::read_text(dir.file("a.log")), log_b = testing::read_text(dir.file("b.log"));
  ASSERT_EQ(testing::read_text(dir.file("a.rc")), "0\n") << log_a;
  ASSERT_EQ(testing::read_text(dir.file("b.rc")), "0\n") << log_b;
  auto one = run(std::string(TANDEM_CLI) + " " + train + "/one-{rank}.st --nproc-per-node 4 2>&1");
  ASSERT_EQ(one.exit_code, 0) << one.output;
  auto reference = testing::read_text(dir.file("one-0.st"));
  ASSERT_GT(reference.size(), 100000u);
  for (const char* name : {"two-0.st", "two-1.st", "two-2.st", "two-3.st", "one-1.st", "one-2.st", "one-3.st"}) {
    EXPECT_TRUE(testing::read_text(dir.file(name)) == reference) << name << " differs from one-0.st";
  }
}

// The link between the hosts goes down mid-training: both hosts' jobs end,
// non-zero, within --dist-timeout + 30 s, with an error naming the
// collective that could not finish.
TEST(NetnsTest, ACutLinkEndsTheJobOnBothHosts) {
  TwoHosts hosts;
  ASSERT_TRUE(hosts.ok()) << "creating network namespaces needs root and iproute2: " << hosts.error();
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 128);
  const int timeout = 10;
  std::string train = "train --data idx:" + dir.path() +
                      " --model mlp --batch-size 64 --epochs 1000 --progress lines --dist-timeout " +
                      std::to_string(timeout);
  const int port = dist::pick_free_port();
  run(start_on_both(hosts, port, train, dir) +
               "for i in $(seq 300); do grep -q 'epoch 3/' " + dir.file("a.log") +
               " && break; sleep 0.2; done; date +%s.%N > " + dir.file("cut") + "; " + hosts.cut_link() +
               "; wait; date +%s.%N > " + dir.file("end"));
  auto log_a = testing::read_text(dir.file("a.log")), log_b = testing::read_text(dir.file("b.log"));
  ASSERT_NE(log_a.find("epoch 3/"), std::string::npos) << "training never got going:\n" << log_a;
  double seconds = std::stod(testing::read_text(dir.file("end"))) - std::stod(testing::read_text(dir.file("cut")));
  EXPECT_LT(seconds, timeout + 30) << log_a << log_b;
  const std::regex named(R"((all_reduce|broadcast|barrier|all_gather|recv|send)[^\n]* on rank \d of 4 \(gloo\) (failed|did not finish))");
  for (const auto& [rc, log] : {std::pair{dir.file("a.rc"), log_a}, std::pair{dir.file("b.rc"), log_b}}) {
    EXPECT_NE(testing::read_text(rc), "0\n") << log;
    EXPECT_TRUE(std::regex_search(log, named)) << log;
    EXPECT_NE(log.find("tandem launch: rank "), std::string::npos) << log;
  }
  std::printf("link cut: both hosts ended %.1f s later (--dist-timeout %d)\n", seconds, timeout);
  for (const auto& log : {log_a, log_b}) {  // what each host said, for the record
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);) {
      if (line.find("error") != std::string::npos || line.find("tandem launch:") == 0) {
        std::printf("  %s\n", line.c_str());
      }
    }
  }
}

// A rank on the second host is SIGKILLed mid-training: both launchers exit
// non-zero within 30 s, the second naming the rank and the signal, and no
// process of the job is left on either host.
TEST(NetnsTest, AKilledRankEndsTheJobOnBothHosts) {
  TwoHosts hosts;
  ASSERT_TRUE(hosts.ok()) << "creating network namespaces needs root and iproute2: " << hosts.error();
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 128);
  std::string train = "train --data idx:" + dir.path() +
                      " --model mlp --batch-size 64 --epochs 1000 --progress lines --dist-timeout 60";
  const int port = dist::pick_free_port();
  run(start_on_both(hosts, port, train, dir));
  // Rank 3 (on the second host) once training runs: its environment says RANK=3.
  pid_t victim = 0;
  for (int i = 0; i < 300 && victim == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (testing::read_text(dir.file("a.log")).find("epoch 3/") == std::string::npos) continue;
    auto pids = run("pgrep -f -- '^[^ ]*tandem train --data idx:" + dir.path() + " ' || true").output;
    std::istringstream list(pids);
    for (std::string pid; list >> pid;) {
      auto environ = testing::read_text("/proc/" + pid + "/environ");
      if (environ.find(std::string("\0RANK=3\0", 8)) != std::string::npos) victim = std::stoi(pid);
    }
  }
  ASSERT_GT(victim, 0) << testing::read_text(dir.file("a.log"));
  auto killed_at = std::chrono::steady_clock::now();
  ::kill(victim, SIGKILL);
  for (int i = 0; i < 600; ++i) {
    if (!testing::read_text(dir.file("a.rc")).empty() && !testing::read_text(dir.file("b.rc")).empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
  auto log_a = testing::read_text(dir.file("a.log")), log_b = testing::read_text(dir.file("b.log"));
  EXPECT_LT(seconds, 30) << log_a << log_b;
  EXPECT_NE(testing::read_text(dir.file("a.rc")), "") << log_a;
  EXPECT_NE(testing::read_text(dir.file("a.rc")), "0\n") << log_a;
  EXPECT_NE(testing::read_text(dir.file("b.rc")), "0\n") << log_b;
  EXPECT_NE(log_b.find("rank 3 (pid " + std::to_string(victim) + ") was killed by signal 9 (SIGKILL)"),
            std::string::npos) << log_b;
  EXPECT_NE(log_a.find("tandem launch: rank "), std::string::npos) << log_a;
  EXPECT_EQ(run("pgrep -f -- '^[^ ]*tandem (train|launch) .*" + dir.path() + "' || true").output, "");
  std::printf("rank 3 SIGKILLed on the second host: both hosts ended within %.1f s\n", seconds);
}

}  // namespace
}  // namespace tandem
