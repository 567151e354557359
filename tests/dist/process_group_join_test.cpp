// Joining a job: picked ports, ranks of another world size, a rank that
// never comes or comes twice, another job's token, the store's address,
// NCCL with and without a GPU; each refused with an error that names what
// happened, in bounded time, or the job goes on.
#include "process_group_fixture.h"
#include "tandem/dist/device_mesh.h"

namespace tandem::dist {
namespace {

// Note [ports outside the ephemeral range]: picked ports lie below the
// kernel's ephemeral range, where no outgoing connection can take them
// before the store binds them, and are free.
TEST(ProcessGroupTest, PickedPortsLieBelowTheEphemeralRange) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  ASSERT_TRUE(range >> low >> high) << "cannot read /proc/sys/net/ipv4/ip_local_port_range";
  ASSERT_GE(low, 21000) << "this machine's ephemeral range starts at " << low
                        << ", which leaves pick_free_port no room below it";
  std::set<int> seen;
  for (int i = 0; i < 20; ++i) {
    int port = pick_free_port();
    EXPECT_GE(port, 20000);
    EXPECT_LT(port, low);
    seen.insert(port);
    // Free: a store can listen there.
    Rendezvous rv;
    rv.port = port;
    EXPECT_NO_THROW(ProcessGroup(rv, {})) << "port " << port;
  }
  EXPECT_GT(seen.size(), 10u) << "the picks are not spread";
}

// An address this machine cannot listen on is named at once (a store
// server waited 300 s).
TEST(ProcessGroupTest, PickFreePortNamesABadAddress) {
  EXPECT_GT(pick_free_port("127.0.0.1"), 0);
  EXPECT_EQ(testing::error_of([] { pick_free_port(""); }),
            "rendezvous: the master address is empty (--master-addr / MASTER_ADDR)");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NE(testing::error_of([] { pick_free_port("10.255.255.1"); })
                .find("rendezvous: cannot listen on 10.255.255.1:0: "),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// Ranks started for other world sizes (--nnodes or --nproc-per-node not the
// same on every node) are told so on every rank, before the backend.
TEST(ProcessGroupTest, RanksOfAnotherWorldSizeAreNamed) {
  const int port = pick_free_port();
  GroupOptions options;
  options.timeout = 20s;
  std::vector<std::string> errors(2);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> ranks;
  for (int64_t rank : {0, 1}) {
    ranks.emplace_back([&, rank] {
      Rendezvous rv;
      rv.port = port;
      rv.rank = rank;
      rv.world_size = rank == 0 ? 2 : 3;
      rv.source = "test";
      errors[rank] = testing::error_of([&] { ProcessGroup group(rv, options); });
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  for (int64_t rank : {0, 1}) {
    EXPECT_EQ(errors[rank], "rendezvous at 127.0.0.1:" + std::to_string(port) +
                                " (test): rank 1 was started for a job of 3 ranks, rank 0 for 2: every "
                                "node of the job must start its workers with the same --nnodes and "
                                "--nproc-per-node")
        << "rank " << rank;
  }
}

// Note [who joined]: a rank that never comes is named, on every rank that
// did, when the timeout ends (before, Gloo's "wait timeout ..., keys: /0/1").
TEST(ProcessGroupTest, AMissingRankIsNamedAfterTheTimeout) {
  const int port = pick_free_port();
  GroupOptions options;
  options.timeout = 1500ms;
  std::vector<std::string> errors(3);
  std::vector<std::thread> ranks;
  for (int64_t rank : {0, 2}) {
    ranks.emplace_back([&, rank] {
      Rendezvous rv;
      rv.port = port;
      rv.rank = rank;
      rv.world_size = 3;
      rv.source = "test";
      try {
        ProcessGroup group(rv, options);
      } catch (const Error& e) {
        errors[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  // Rank 0 hosts the store and gives up first; rank 2 ends with its verdict.
  for (int64_t rank : {0, 2}) {
    EXPECT_NE(errors[rank].find("rendezvous at 127.0.0.1:" + std::to_string(port) +
                                " (test): 1 of 3 ranks did not join within 1.5 s (rank 1); every node "
                                "of the job must start its workers with the same --nnodes"),
              std::string::npos)
        << "rank " << rank << ": " << errors[rank];
  }
}

// ... and a second process with a rank that has joined is refused at once,
// while the job goes on.
TEST(ProcessGroupTest, TheSameRankTwiceIsRefused) {
  const int port = pick_free_port();
  auto rendezvous = [port](int64_t rank) {
    Rendezvous rv;
    rv.port = port;
    rv.rank = rank;
    rv.world_size = 2;
    rv.source = "test";
    return rv;
  };
  GroupOptions options;
  options.timeout = 20s;
  std::unique_ptr<ProcessGroup> rank0, rank1;
  std::thread first([&] { rank0 = std::make_unique<ProcessGroup>(rendezvous(0), options); });
  rank1 = std::make_unique<ProcessGroup>(rendezvous(1), options);
  first.join();
  ASSERT_TRUE(rank0 && rank1);
  try {
    ProcessGroup again(rendezvous(1), options);
    ADD_FAILURE() << "a second rank 1 joined";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(": rank 1 of 2 has joined already: two processes of the job "
                                         "have RANK=1 (the same --node-rank on two nodes?)"),
              std::string::npos)
        << e.what();
  }
  auto a = torch::ones({1});
  auto b = torch::full({1}, 2.0f);
  std::thread reduce0([&] { rank0->all_reduce(a).wait(); });
  rank1->all_reduce(b).wait();
  reduce0.join();
  EXPECT_EQ(a.item<float>(), 3.0f);
  EXPECT_EQ(b.item<float>(), 3.0f);
}

// Note [job token]: a process whose token differs from rank 0's is refused
// with a clear message and leaves nothing behind; the right rank 1 then
// joins and the job runs.
TEST(ProcessGroupTest, AWrongJobTokenIsRefusedAndTheJobGoesOn) {
  auto rendezvous = [port = pick_free_port()](int64_t rank, const std::string& token) {
    Rendezvous rv;
    rv.port = port;
    rv.rank = rank;
    rv.world_size = 2;
    rv.source = "test";
    rv.job_token = token;
    return rv;
  };
  GroupOptions options;
  options.timeout = 20s;
  std::string rank0_error;
  float sum = 0;
  std::thread rank0([&] {
    try {
      ProcessGroup group(rendezvous(0, "alpha"), options);
      auto t = torch::ones({1});
      group.all_reduce(t).wait();
      sum = t.item<float>();
    } catch (const std::exception& e) {
      rank0_error = e.what();
    }
  });
  for (std::string wrong : {"beta", ""}) {
    try {
      ProcessGroup stray(rendezvous(1, wrong), options);
      ADD_FAILURE() << "a process with token '" << wrong << "' joined";
    } catch (const Error& e) {
      std::string message = e.what();
      EXPECT_NE(message.find("refused rank 1: "), std::string::npos) << message;
      EXPECT_NE(message.find(wrong.empty() ? "the job has a job token and this process none"
                                           : "this process's job token does not match the job's"),
                std::string::npos) << message;
      EXPECT_EQ(message.find("alpha"), std::string::npos) << "the message shows the token: " << message;
    }
  }
  std::string rank1_error;
  try {
    ProcessGroup group(rendezvous(1, "alpha"), options);
    auto t = torch::full({1}, 2.0f);
    group.all_reduce(t).wait();
  } catch (const std::exception& e) {
    rank1_error = e.what();
  }
  rank0.join();
  EXPECT_EQ(rank0_error, "");
  EXPECT_EQ(rank1_error, "");
  EXPECT_EQ(sum, 3.0f);
}

// Note [store address]: rank 0's store listens on the address it was given
// (loopback here), not on every interface.
TEST(ProcessGroupTest, TheStoreListensOnlyOnItsAddress) {
  Rendezvous rv;
  rv.port = pick_free_port();
  ProcessGroup group(rv);
  char wanted[8];
  std::snprintf(wanted, sizeof wanted, "%04X", rv.port);
  std::vector<std::string> listening;  // local addresses on that port, state LISTEN (0A)
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream lines(testing::read_text(table));
    std::string line;
    std::getline(lines, line);  // header
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      if (state == "0A" && local.substr(local.find(':') + 1) == wanted) {
        listening.push_back(local.substr(0, local.find(':')));
      }
    }
  }
  EXPECT_EQ(listening, (std::vector<std::string>{"0100007F"}));  // 127.0.0.1 only
}

// One NCCL rank on cuda:0.
GroupOptions nccl_on_cuda0() {
  GroupOptions options;
  options.backend = "nccl";
  options.device = "cuda:0";
  return options;
}

// Without a CUDA device (CI), --dist-backend nccl is a clear error; so it
// is with one, in a build without NCCL.
TEST(ProcessGroupTest, NcclNeedsACudaDevice) {
  if (built_with_nccl() && torch::cuda::is_available()) {
    GTEST_SKIP() << "a CUDA device is visible, so NCCL is not refused (NcclGroupOfOneRunsOnTheGpu runs it)";
  }
  Rendezvous rv;
  rv.port = pick_free_port();
  const auto options = nccl_on_cuda0();
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(testing::error_of([&] { ProcessGroup group(rv, options); }),
              "--dist-backend nccl: no CUDA device is visible to rank 0 (NCCL reduces CUDA "
              "tensors; use --dist-backend gloo on CPU)");
  } else {
    EXPECT_EQ(testing::error_of([&] { ProcessGroup group(rv, options); }),
              "--dist-backend nccl: this build has no NCCL support (it was compiled without "
              "nccl.h; see docs/BUILD.md); use --dist-backend gloo");
  }
}

// With one (the GPU machine), a group of one NCCL rank runs collectives on it.
TEST(ProcessGroupTest, NcclGroupOfOneRunsOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  if (!built_with_nccl()) GTEST_SKIP() << "needs a build with NCCL";
  Rendezvous rv;
  rv.port = pick_free_port();
  const auto options = nccl_on_cuda0();
  ProcessGroup group(rv, options);
  EXPECT_EQ(group.backend(), "nccl");
  auto t = torch::arange(4, torch::TensorOptions().dtype(torch::kFloat).device(torch::kCUDA));
  std::vector<torch::Tensor> out{torch::empty_like(t)};
  group.all_gather(out, t).wait();
  EXPECT_TRUE(torch::equal(out[0].cpu(), t.cpu()));
  auto sum = t.clone();
  group.reduce(sum, 0, ReduceOp::kAvg).wait();  // through NCCL: reduce has no shortcut
  EXPECT_TRUE(torch::equal(sum.cpu(), t.cpu()));
}

}  // namespace
}  // namespace tandem::dist
