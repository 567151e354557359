// Process groups that fail: a timeout (naming the collective and the rank
// that did not come), a peer that leaves, a port in use, no rank 0, a
// master address that is no host or no store; each ends in an error that
// names what happened, in bounded time. Joining a job is
// process_group_join_test.cpp's.
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
    auto t = torch::ones({1000});
    // One collective first, so that the peer leaves a group both joined
    // (leaving during Gloo's lazy connection fails the connection instead).
    g.all_reduce(t).wait();
    if (g.rank() == 1) throw std::runtime_error("rank 1 gives up");
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

}  // namespace
}  // namespace tandem::dist
