// Process groups over Gloo on 127.0.0.1, ranks as threads of this test:
// every collective against its reference, their traffic, and the manual
// gradient averaging of seed 004.
#include "process_group_fixture.h"

namespace tandem::dist {
namespace {

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
    // Chunks of one buffer (Note [reduce-scatter over Gloo]: sent as the
    // buffer itself), averaged; the buffer is left as it was.
    auto buffer = torch::arange(3 * w, torch::kFloat32).view({w, 3}) + float(r);
    const auto before = buffer.clone();
    auto averaged = torch::empty({3});
    g.reduce_scatter(averaged, buffer.unbind(0), ReduceOp::kAvg).wait();
    EXPECT_TRUE(torch::allclose(averaged, torch::arange(3 * r, 3 * r + 3, torch::kFloat32) + float(w - 1) / 2));
    EXPECT_TRUE(torch::equal(buffer, before));

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

}  // namespace
}  // namespace tandem::dist
