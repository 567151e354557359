// Process groups over Gloo on 127.0.0.1, ranks as threads of this test:
// every collective against its reference, the manual gradient averaging of
// seed 004, and the failures (timeout, a peer that leaves, a port in use, no
// rank 0) ending in an error that names the collective, in bounded time.
#include <gtest/gtest.h>

#include <fstream>
#include <set>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/dist/process_group.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::dist {
namespace {

using namespace std::chrono_literals;

// fn(group) on `world` ranks (threads): testing::run_ranks with a reference.
std::vector<std::string> run_ranks(int world, const std::function<void(ProcessGroup&)>& fn,
                                   GroupOptions options = {}, int port = 0) {
  return testing::run_ranks(world, [&](std::shared_ptr<ProcessGroup> g) { fn(*g); }, options, port);
}

using testing::expect_no_errors;

TEST(ProcessGroupTest, AllReduceOps) {
  const int world = 3;
  expect_no_errors(run_ranks(world, [](ProcessGroup& g) {
    EXPECT_EQ(g.backend(), "gloo");
    double r = static_cast<double>(g.rank());
    auto sum = torch::full({5}, r + 1);
    g.all_reduce(sum).wait();
    EXPECT_TRUE(torch::equal(sum, torch::full({5}, 6.0)));
    auto avg = torch::full({2, 3}, r * 3);
    g.all_reduce(avg, ReduceOp::kAvg).wait();
    EXPECT_TRUE(torch::allclose(avg, torch::full({2, 3}, 3.0)));
    auto mn = torch::tensor({r, -r}), mx = torch::tensor({r, -r});
    g.all_reduce(mn, ReduceOp::kMin).wait();
    g.all_reduce(mx, ReduceOp::kMax).wait();
    EXPECT_TRUE(torch::equal(mn, torch::tensor({0.0, -2.0})));
    EXPECT_TRUE(torch::equal(mx, torch::tensor({2.0, 0.0})));
    auto ints = torch::full({4}, g.rank() + 10, torch::kInt64);
    g.all_reduce(ints, ReduceOp::kAvg).wait();  // (10 + 11 + 12) / 3, integer
    EXPECT_TRUE(torch::equal(ints, torch::full({4}, 11, torch::kInt64)));
    std::vector<torch::Tensor> several{torch::ones({2}), torch::ones({3}) * r};
    g.all_reduce(several).wait();
    EXPECT_TRUE(torch::equal(several[0], torch::full({2}, 3.0)));
    EXPECT_TRUE(torch::equal(several[1], torch::full({3}, 3.0)));
  }));
}

// Note [traffic]: each collective counts its calls and this rank's
// payload bytes, per group, until a reset; a duplicate's count in its own
// and in its origin's (what FSDP and the pipeline send through duplicates
// is their group's traffic), a reset of the origin leaving the duplicate's.
TEST(ProcessGroupTest, TrafficCountsEachCollectivesPayload) {
  expect_no_errors(run_ranks(2, [](ProcessGroup& g) {
    auto floats = torch::ones({10});  // 40 bytes
    g.all_reduce(floats).wait();
    std::vector<torch::Tensor> pair{torch::ones({3}, torch::kFloat64), torch::ones({2}, torch::kFloat64)};
    g.all_reduce(pair).wait();  // 24 + 16
    g.broadcast(floats, 0).wait();
    std::vector<torch::Tensor> gathered{torch::empty({10}), torch::empty({10})};
    g.all_gather(gathered, floats).wait();
    if (g.rank() == 0) {
      g.send(floats, 1).wait();
    } else {
      g.recv(floats, 0).wait();
    }
    auto twin = g.duplicate("twin");
    twin->all_reduce(floats).wait();
    const auto t = g.traffic();
    EXPECT_EQ(t.at("all_reduce").calls, 3);
    EXPECT_EQ(t.at("all_reduce").bytes, 40 + 24 + 16 + 40);
    EXPECT_EQ(t.at("broadcast").bytes, 40);
    EXPECT_EQ(t.at("all_gather").bytes, 40);
    EXPECT_EQ(t.at(g.rank() == 0 ? "send" : "recv").bytes, 40);
    EXPECT_EQ(t.count(g.rank() == 0 ? "recv" : "send"), 0u);
    EXPECT_EQ(twin->traffic().at("all_reduce").bytes, 40);
    g.reset_traffic();
    EXPECT_TRUE(g.traffic().empty());
    EXPECT_EQ(twin->traffic().size(), 1u);
    twin->duplicate("twin of twin")->broadcast(floats, 0).wait();  // counted all the way up
    EXPECT_EQ(g.traffic().at("broadcast").bytes, 40);
    EXPECT_EQ(twin->traffic().at("broadcast").bytes, 40);
  }));
}

// A duplicate is the same ranks over connections of its own: its
// collectives and messages are its own (a message sent on one group is not
// received on the other, whatever the tag), and both groups keep working.
TEST(ProcessGroupTest, ADuplicateGroupHasItsOwnTraffic) {
  expect_no_errors(run_ranks(3, [](ProcessGroup& g) {
    auto dup = g.duplicate("second");
    EXPECT_EQ(dup->rank(), g.rank());
    EXPECT_EQ(dup->size(), 3);
    EXPECT_EQ(dup->backend(), "gloo");
    auto a = torch::full({4}, static_cast<double>(g.rank()));
    auto b = torch::full({4}, 10.0 * static_cast<double>(g.rank()));
    auto wa = g.all_reduce(a);
    auto wb = dup->all_reduce(b);
    wb.wait();
    wa.wait();
    EXPECT_TRUE(torch::equal(a, torch::full({4}, 3.0)));
    EXPECT_TRUE(torch::equal(b, torch::full({4}, 30.0)));
    auto again = g.duplicate("second");  // the same name twice: a group of its own too
    auto c = torch::full({2}, 1.0);
    again->all_reduce(c).wait();
    EXPECT_TRUE(torch::equal(c, torch::full({2}, 3.0)));
    // Rank 0 sends 1 on the duplicate, then 2 on the first group, same tag;
    // rank 1 receives from the first group first and gets 2.
    if (g.rank() == 0) {
      auto one = torch::full({1}, 1.0), two = torch::full({1}, 2.0);
      auto w1 = dup->send(one, 1, 7);
      auto w2 = g.send(two, 1, 7);
      w1.wait();
      w2.wait();
    } else if (g.rank() == 1) {
      auto first = torch::zeros({1}), second = torch::zeros({1});
      g.recv(first, 0, 7).wait();
      dup->recv(second, 0, 7).wait();
      EXPECT_EQ(first.item<double>(), 2.0);
      EXPECT_EQ(second.item<double>(), 1.0);
    }
  }));
}

TEST(ProcessGroupTest, RootedAndGatheringCollectives) {
  const int world = 4;
  expect_no_errors(run_ranks(world, [](ProcessGroup& g) {
    const int64_t r = g.rank(), w = g.size();
    auto b = torch::full({3}, static_cast<float>(r));
    g.broadcast(b, /*root=*/2).wait();
    EXPECT_TRUE(torch::equal(b, torch::full({3}, 2.0f)));

    auto red = torch::full({2}, static_cast<float>(r + 1));
    g.reduce(red, /*root=*/1).wait();
    if (r == 1) EXPECT_TRUE(torch::equal(red, torch::full({2}, 10.0f)));

    std::vector<torch::Tensor> all(w);
    for (auto& t : all) t = torch::empty({2});
    g.all_gather(all, torch::full({2}, static_cast<float>(r * r))).wait();
    for (int64_t i = 0; i < w; ++i) EXPECT_TRUE(torch::equal(all[i], torch::full({2}, float(i * i))));

    std::vector<torch::Tensor> gathered;
    if (r == 3) for (int64_t i = 0; i < w; ++i) gathered.push_back(torch::empty({1}));
    g.gather(gathered, torch::full({1}, static_cast<float>(r + 100)), /*root=*/3).wait();
    if (r == 3) {
      for (int64_t i = 0; i < w; ++i) EXPECT_EQ(gathered[i].item<float>(), 100 + i);
    }

    std::vector<torch::Tensor> pieces;
    if (r == 0) for (int64_t i = 0; i < w; ++i) pieces.push_back(torch::full({2}, float(10 * i)));
    auto piece = torch::empty({2});
    g.scatter(piece, pieces, /*root=*/0).wait();
    EXPECT_TRUE(torch::equal(piece, torch::full({2}, float(10 * r))));

    std::vector<torch::Tensor> inputs;
    for (int64_t i = 0; i < w; ++i) inputs.push_back(torch::full({3}, float(i + r)));
    auto mine = torch::empty({3});
    g.reduce_scatter(mine, inputs).wait();  // sum over ranks q of (r + q)
    EXPECT_TRUE(torch::equal(mine, torch::full({3}, float(w * r + w * (w - 1) / 2))));

    g.barrier().wait();

    // A ring: send to the right, receive from the left.
    auto out = torch::full({4}, static_cast<float>(r));
    auto in = torch::empty({4});
    auto sent = g.send(out, (r + 1) % w, /*tag=*/7);
    g.recv(in, (r + w - 1) % w, /*tag=*/7).wait();
    sent.wait();
    EXPECT_TRUE(torch::equal(in, torch::full({4}, float((r + w - 1) % w))));
  }));
}

// Seed 004: each rank's gradient of the mean loss on its shard, averaged,
// equals the gradient of the mean loss on the whole batch.
TEST(ProcessGroupTest, AverageGradientsEqualsTheWholeBatchGradient) {
  const int world = 2;
  torch::manual_seed(3);
  auto inputs = torch::randn({8, 5});
  auto targets = torch::randint(0, 3, {8}, torch::kInt64);
  torch::nn::Linear reference(5, 3);
  torch::nn::functional::cross_entropy(reference->forward(inputs), targets).backward();
  expect_no_errors(run_ranks(world, [&](ProcessGroup& g) {
    torch::nn::Linear model(5, 3);
    {
      torch::NoGradGuard no_grad;  // a different start on every rank...
      for (auto& p : model->parameters()) p.uniform_(-1, 1);
    }
    broadcast_module(*model, g, /*root=*/0);  // ...then rank 0's everywhere
    {
      torch::NoGradGuard no_grad;
      if (g.rank() == 0) {
        model->weight.copy_(reference->weight);
        model->bias.copy_(reference->bias);
      }
    }
    broadcast_module(*model, g, 0);
    auto shard = torch::arange(g.rank() * 4, (g.rank() + 1) * 4);
    torch::nn::functional::cross_entropy(model->forward(inputs.index_select(0, shard)),
                                         targets.index_select(0, shard))
        .backward();
    average_gradients(*model, g);
    EXPECT_TRUE(torch::allclose(model->weight.grad(), reference->weight.grad(), 1e-6, 1e-7));
    EXPECT_TRUE(torch::allclose(model->bias.grad(), reference->bias.grad(), 1e-6, 1e-7));
  }));
}

// Mixed dtypes, non-contiguous tensors (a transpose; every other column of
// a matrix, which reshape flattens to a strided view that the backend once
// read as contiguous), an empty one, and a cap so small that every tensor
// is its own pack: all end equal to the root's, and the columns skipped
// stay as they were.
TEST(ProcessGroupTest, BroadcastCoalescedEqualsTheRootsTensors) {
  for (int64_t cap : {int64_t(1) << 20, int64_t(8)}) {
    expect_no_errors(run_ranks(3, [cap](ProcessGroup& g) {
      auto fill = [](int64_t r) {  // a generator of its own: ranks are threads
        auto gen = at::detail::createCPUGenerator(static_cast<uint64_t>(10 + r));
        return std::vector<torch::Tensor>{
            torch::randn({3, 4}, gen), torch::randint(0, 100, {5}, gen, torch::kInt64),
            torch::randn({4, 6}, gen).t(), torch::empty({0}),
            torch::randn({2}, gen, torch::TensorOptions().dtype(torch::kFloat64)),
            torch::randn({5, 8}, gen).slice(/*dim=*/1, 0, 8, /*step=*/2)};
      };
      auto mine = fill(g.rank());
      auto want = fill(1);
      const torch::Tensor base(mine.back()._base());  // the matrix the last one is every other column of
      auto whole = base.clone();
      broadcast_coalesced(mine, g, /*root=*/1, cap);
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_TRUE(torch::equal(mine[i], want[i])) << "tensor " << i << " on rank " << g.rank();
      }
      auto skipped = base.slice(1, 1, 8, 2);
      EXPECT_TRUE(torch::equal(skipped, whole.slice(1, 1, 8, 2))) << "rank " << g.rank();
    }));
  }
}

// A collective's completion time is recorded by the backend, and then()
// runs after the division of an average.
TEST(ProcessGroupTest, WorkRecordsCompletionAndRunsThen) {
  expect_no_errors(run_ranks(2, [](ProcessGroup& g) {
    auto t = torch::full({4}, static_cast<float>(g.rank() + 1));
    auto before = std::chrono::steady_clock::now();
    auto work = g.all_reduce(t, ReduceOp::kAvg);
    float seen = 0;
    work.then([&] { seen = t[0].item<float>(); });
    work.wait();
    EXPECT_EQ(seen, 1.5f);
    ASSERT_TRUE(work.finished_at().has_value());
    EXPECT_GE(*work.finished_at(), before);
    EXPECT_LE(*work.finished_at(), std::chrono::steady_clock::now());
  }));
}

// Gloo launches are serialised process-wide (Note [one launch at a time] in
// src/dist/process_group.cpp: unserialised, two ranks-as-threads launching
// their first collectives together could crash in c10d's flight recorder).
// A launch waits while the lock is held (here by a thread of the test's own,
// once the ranks have joined their group), and goes on when it is freed.
TEST(ProcessGroupTest, GlooLaunchesTakeTheProcesssLaunchLock) {
  std::atomic<int> joined{0}, launched{0};
  std::atomic<bool> locked{false}, release{false};
  std::thread holder([&] {
    while (joined.load() < 2) std::this_thread::yield();
    std::lock_guard<std::mutex> held(gloo_launch_mutex());
    locked = true;
    while (!release.load()) std::this_thread::yield();
  });
  expect_no_errors(run_ranks(2, [&](ProcessGroup& g) {
    joined.fetch_add(1);
    while (!locked.load()) std::this_thread::yield();
    std::thread releaser;
    if (g.rank() == 0) {
      releaser = std::thread([&] {
        std::this_thread::sleep_for(300ms);
        EXPECT_EQ(launched.load(), 0) << "a launch went ahead while the lock was held";
        release = true;
      });
    }
    auto t = torch::full({2}, static_cast<double>(g.rank()));
    auto work = g.all_reduce(t);
    launched.fetch_add(1);
    EXPECT_TRUE(release.load());
    work.wait();
    EXPECT_TRUE(torch::equal(t, torch::full({2}, 1.0)));
    if (releaser.joinable()) releaser.join();
  }));
  holder.join();
  EXPECT_EQ(launched.load(), 2);
}

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
