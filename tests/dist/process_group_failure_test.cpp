// Process groups that fail: a timeout, a peer that leaves, a port in use,
// no rank 0, ranks of another job or world size, NCCL without a GPU; each
// ends in an error that names what happened, in bounded time.
#include "process_group_fixture.h"
#include "tandem/dist/device_mesh.h"

namespace tandem::dist {
namespace {

TEST(ProcessGroupTest, TimeoutNamesTheCollective) {
  GroupOptions options;
  options.timeout = 1500ms;
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(2, [](ProcessGroup& g) {
    if (g.rank() == 1) {
      std::this_thread::sleep_for(4s);  // alive, but never joins the all_reduce
      return;
    }
    auto t = torch::ones({3});
    g.all_reduce(t).wait();
  }, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(errors[0].find("all_reduce on rank 0 of 2 (gloo)"), std::string::npos) << errors[0];
  EXPECT_LT(seconds, 15);
}

// Note [who did not come]: the ranks that time out name the rank that never
// reached the collective, by its number in the group; a point-to-point
// wait names its peer.
TEST(ProcessGroupTest, ATimeoutNamesTheRankThatDidNotCome) {
  GroupOptions options;
  options.timeout = 1500ms;
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(3, [](ProcessGroup& g) {
    auto t = torch::ones({3});
    g.all_reduce(t).wait();  // every rank: collective #1
    g.broadcast(t, 0).wait();  // #2
    if (g.rank() == 2) {
      std::this_thread::sleep_for(6s);  // alive, but never joins #3
      return;
    }
    g.all_reduce(t).wait();
  }, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r : {0, 1}) {
    EXPECT_NE(errors[r].find("all_reduce on rank " + std::to_string(r) + " of 3 (gloo) failed: "), std::string::npos)
        << errors[r];
    EXPECT_NE(errors[r].find("(a peer did not answer within the --dist-timeout of 1.5 s; rank 2 did not report "
                             "reaching this all_reduce (this group's collective #3; ranks 0 and 1 reached it): it "
                             "is elsewhere in the program, stopped, or cut off from the job's store)"),
              std::string::npos)
        << errors[r];
  }
  EXPECT_EQ(errors[2], "");
  EXPECT_LT(seconds, 15);

  // Over two groups (a group and its duplicate, as FSDP and the pipeline
  // use): rank 2 launched the group's collective #2 and waits in the
  // duplicate's #1, rank 0 waits in the group's #2, rank 1 in neither.
  // Each names rank 1; rank 2 counts as having reached the group's #2, and
  // rank 0 as not having reached the duplicate's #1.
  errors = run_ranks(3, [](ProcessGroup& g) {
    auto side = g.duplicate("side");
    auto t = torch::ones({3});
    g.all_reduce(t).wait();  // #1
    if (g.rank() == 1) {
      std::this_thread::sleep_for(6s);
      return;
    }
    auto u = torch::ones({3});
    auto work = g.all_reduce(u);  // #2
    if (g.rank() == 0) work.wait();
    side->all_reduce(t).wait();  // the duplicate's #1
  }, options);
  EXPECT_NE(errors[0].find("rank 1 did not report reaching this all_reduce (this group's collective #2; ranks 0 and 2 "
                           "reached it)"),
            std::string::npos)
      << errors[0];
  EXPECT_NE(errors[2].find("rank 1 did not report reaching this all_reduce (this group's collective #1; rank 2 "
                           "reached it): it is elsewhere in the program, stopped, or cut off from the job's store; "
                           "rank 0 had not reached it yet (it waited in an earlier collective, or in another "
                           "group's))"),
            std::string::npos)
      << errors[2];

  // A recv whose sender never sends: the peer is named.
  errors = run_ranks(2, [](ProcessGroup& g) {
    if (g.rank() == 0) {
      std::this_thread::sleep_for(4s);
      return;
    }
    auto t = torch::zeros({2});
    g.recv(t, 0).wait();
  }, options);
  EXPECT_NE(errors[1].find("recv on rank 1 of 2 (gloo) failed: "), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("(a peer did not answer within the --dist-timeout of 1.5 s: rank 0, this recv's peer)"),
            std::string::npos)
      << errors[1];
}

// Note [a silent rank]: a rank frozen in one group's collective leaves a
// chain of waiting ranks in the others. Over dp=2 x tp=2, rank 1 never
// comes: rank 0 waits for it over tp, rank 2 for rank 0 over dp, rank 3
// for rank 2 over tp. Rank 2's group has no absent rank (rank 0 timed out
// in the other), and it named rank 0 as not having reached the
// all_reduce; every rank that times out now names rank 1, the one that
// reported nothing in any group. So does a recv whose peer timed out too
// (pp=2 x tp=2's stage 0 waiting for stage 1, which waits over tp).
TEST(ProcessGroupTest, ASilentRankAtTheEndOfAChainIsNamed) {
  GroupOptions options;
  options.timeout = 1500ms;
  // The silent rank stays in no collective until the others have failed.
  std::atomic<int> failed{0};
  auto fails = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (...) {
      ++failed;
      throw;
    }
  };
  auto stay_silent = [&] {
    while (failed < 3) std::this_thread::sleep_for(50ms);
  };
  auto errors = testing::run_ranks(4, [&](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("dp=2,tp=2", 4));
    auto t = torch::ones({3});
    if (world->rank() == 1) return stay_silent();
    fails([&] {
      if (world->rank() == 2) mesh.group(MeshDim::kData)->all_reduce(t).wait();  // with rank 0, which never comes
      mesh.group(MeshDim::kTensor)->all_reduce(t).wait();
    });
  }, options);
  for (int r : {0, 2, 3}) {
    EXPECT_NE(errors[r].find("rank 1 "), std::string::npos) << "rank " << r << ": " << errors[r];
  }
  EXPECT_NE(errors[2].find("rank 1 of the job reported nothing, in any group"), std::string::npos) << errors[2];

  failed = 0;
  errors = testing::run_ranks(4, [&](std::shared_ptr<ProcessGroup> world) {
    DeviceMesh mesh(world, parse_mesh("pp=2,tp=2", 4));
    auto t = torch::ones({3});
    const auto pp = mesh.group(MeshDim::kPipeline);
    if (world->rank() == 2) return stay_silent();  // stage 1's first tp rank
    fails([&] {
      if (pp->rank() == 0) {
        pp->recv(t, 1).wait();  // from stage 1, which waits over tp
      } else {
        mesh.group(MeshDim::kTensor)->all_reduce(t).wait();
      }
    });
  }, options);
  EXPECT_NE(errors[1].find("rank 3, this recv's peer, timed out too, waiting elsewhere; rank 2 of the job reported "
                           "nothing, in any group"),
            std::string::npos)
      << errors[1];
  EXPECT_NE(errors[3].find("rank 2 did not report reaching this all_reduce"), std::string::npos) << errors[3];
}

TEST(ProcessGroupTest, APeerThatLeavesFailsTheCollectiveQuickly) {
  GroupOptions options;
  options.timeout = 60s;
  auto start = std::chrono::steady_clock::now();
  auto errors = run_ranks(2, [](ProcessGroup& g) {
    if (g.rank() == 1) throw std::runtime_error("rank 1 gives up");
    auto t = torch::ones({1000});
    for (int i = 0; i < 3; ++i) g.all_reduce(t).wait();
  }, options);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(errors[1], "rank 1 gives up");
  EXPECT_NE(errors[0].find("all_reduce on rank 0 of 2 (gloo) failed"), std::string::npos) << errors[0];
  EXPECT_LT(seconds, 30) << "took the whole timeout";
}

TEST(ProcessGroupTest, PortInUseIsAClearError) {
  int port = pick_free_port();
  std::string error;
  run_ranks(1, [&](ProcessGroup&) {
    Rendezvous second;
    second.port = port;
    try {
      ProcessGroup clash(second);
    } catch (const Error& e) {
      error = e.what();
    }
  }, {}, port);
  EXPECT_NE(error.find("port " + std::to_string(port) + " on 127.0.0.1 is already in use"),
            std::string::npos)
      << error;
}

// Rank 1 of a job of 2 whose rank 0 is at host:port.
Rendezvous second_of_two(const std::string& host, int port) {
  Rendezvous rv;
  rv.host = host;
  rv.port = port;
  rv.rank = 1;
  rv.world_size = 2;
  rv.local_rank = 1;
  rv.local_world_size = 2;
  rv.source = "test";
  return rv;
}

TEST(ProcessGroupTest, NoRankZeroIsAClearErrorAfterTheTimeout) {
  Rendezvous rv = second_of_two("127.0.0.1", pick_free_port());
  GroupOptions options;
  options.timeout = 1500ms;
  const auto start = std::chrono::steady_clock::now();
  try {
    ProcessGroup group(rv, options);
    FAIL() << "joined a group without rank 0";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "rendezvous at 127.0.0.1:" + std::to_string(rv.port) +
                  " (test): no store answered rank 1 within 1.5 s: rank 0 (on the node with "
                  "--node-rank 0) has not started, or another program holds that port; every node "
                  "must start its workers with the same --master-addr and --master-port");
  }
  // Note [store deadline]: c10d alone tries again after its timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2900ms);
}

// A master address that names no host ends a joining rank at once, not
// after the timeout as if rank 0 had not started (a sweep's find: 300 s by
// default). The name is one no resolver accepts, so no DNS is asked.
TEST(ProcessGroupTest, AnUnresolvableMasterAddressIsAnErrorAtOnce) {
  Rendezvous rv = second_of_two("no such host!", 29500);
  GroupOptions options;
  options.timeout = 30s;
  const auto start = std::chrono::steady_clock::now();
  auto message = testing::error_of([&] { ProcessGroup group(rv, options); });
  EXPECT_EQ(message.rfind("rendezvous at no such host!:29500 (test): cannot resolve no such host!: ", 0), 0u)
      << message;
  EXPECT_NE(message.find("; --master-addr (MASTER_ADDR) must name the host of rank 0"), std::string::npos) << message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
}

// Note [store deadline]: a port held by a server that is not a store (here a
// socket that listens and never answers) ends the rank at the timeout; c10d's
// client alone waits for the handshake's answer for good.
TEST(ProcessGroupTest, AnotherServerOnThePortIsAnErrorAtTheTimeout) {
  const int port = pick_free_port();
  const int server = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(server, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(server, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(server, 8), 0);
  Rendezvous rv;
  rv.port = port;
  rv.rank = 1;
  rv.world_size = 2;
  rv.source = "test";
  GroupOptions options;
  options.timeout = 1500ms;
  const auto start = std::chrono::steady_clock::now();
  std::string error = testing::error_of([&] { ProcessGroup group(rv, options); });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2900ms);
  EXPECT_NE(error.find("(test): no store answered rank 1 within 1.5 s"), std::string::npos) << error;
  ::close(server);
}

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

// Without a CUDA device (CI), --dist-backend nccl is a clear error (as it is
// in a build without NCCL, on any machine).
TEST(ProcessGroupTest, NcclNeedsACudaDevice) {
  if (built_with_nccl() && torch::cuda::is_available()) {
    GTEST_SKIP() << "a CUDA device is visible, so NCCL is not refused (NcclGroupOfOneRunsOnTheGpu runs it)";
  }
  Rendezvous rv;
  rv.port = pick_free_port();
  const auto options = nccl_on_cuda0();
  if (!built_with_nccl()) {
    EXPECT_EQ(testing::error_of([&] { ProcessGroup group(rv, options); }),
              "--dist-backend nccl: this build has no NCCL support (it was compiled without "
              "nccl.h; see docs/BUILD.md); use --dist-backend gloo");
  } else {
    EXPECT_EQ(testing::error_of([&] { ProcessGroup group(rv, options); }),
              "--dist-backend nccl: no CUDA device is visible to rank 0 (NCCL reduces CUDA "
              "tensors; use --dist-backend gloo on CPU)");
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
