// The one-process pipeline's machinery: micro-batches in flight, failing
// stages, hand-offs, its threads and streams, and bad options.
#include "pipeline_fixture.h"

namespace tandem::parallel {
namespace {

TEST(PipelineTest, MicroBatchesInFlightPerStage) {
  for (std::string schedule : {"1f1b", "gpipe"}) {
    auto net = small_convnet();
    Pipeline pipe(net, {1, 2, 2, 2}, cpus(4), {8, schedule});
    auto step = pipe.train_step(torch::randn({16, 1, 8, 8}), torch::randint(5, {16}, torch::kInt64),
                                cross_entropy);
    auto plan = make_pipeline_schedule(schedule, 4, 8);
    ASSERT_EQ(step.stages.size(), 4u);
    for (int64_t s = 0; s < 4; ++s) {
      const auto& trace = step.stages[s];
      EXPECT_EQ(trace.actions, plan.actions[s]) << schedule << " stage " << s;
      EXPECT_EQ(trace.max_in_flight, schedule == "1f1b" ? 4 - s : 8) << schedule << " stage " << s;
      for (size_t k = 0; k < trace.start.size(); ++k) {
        EXPECT_LE(trace.start[k], trace.end[k]);
        if (k > 0) EXPECT_LE(trace.end[k - 1], trace.start[k]);
      }
    }
    // F(i) on stage s + 1 begins after F(i) on stage s ended.
    for (int64_t s = 0; s + 1 < 4; ++s) {
      for (size_t k = 0; k < step.stages[s + 1].actions.size(); ++k) {
        const auto& a = step.stages[s + 1].actions[k];
        if (a.op != PipelineOp::kForward) continue;
        for (size_t j = 0; j < step.stages[s].actions.size(); ++j) {
          if (step.stages[s].actions[j] == a) EXPECT_LE(step.stages[s].end[j], step.stages[s + 1].start[k]);
        }
      }
    }
    for (double idle : step.idle_share()) {
      EXPECT_GE(idle, 0.0);
      EXPECT_LT(idle, 1.0);
    }
  }
}

// A stage that throws stops the others (no hang) and its error comes back
// naming the stage and its device.
TEST(PipelineTest, AFailingStageEndsTheStepWithItsError) {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("fc1", nn::Linear(6, 8));
  net->push_back("fc2", nn::Linear(7, 3));  // wrong input width: fails on stage 1
  Pipeline pipe(net, {1, 1}, cpus(2), {4, "1f1b"});
  auto message = error_of([&] {
    pipe.train_step(torch::randn({8, 6}), torch::randint(3, {8}, torch::kInt64), cross_entropy);
  });
  EXPECT_NE(message.find("pipeline stage 1 (cpu): "), std::string::npos) << message;
  EXPECT_NE(message.find("mat1 and mat2 shapes cannot be multiplied"), std::string::npos) << message;
}

// Note [spinning hand-offs]: a stage that polls for its input and one that
// sleeps on it run the same arithmetic in the same order, so the two give
// bit-identical losses and gradients.
TEST(PipelineTest, PollingAndSleepingHandOffsGiveTheSameStep) {
  std::vector<torch::Tensor> losses;
  std::vector<models::Sequence> nets;
  for (auto spin : {std::chrono::microseconds(0), PipelineOptions{}.spin, std::chrono::microseconds(50000)}) {
    torch::manual_seed(31);
    auto net = small_convnet();
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    PipelineOptions options{4, "1f1b"};
    options.spin = spin;
    Pipeline pipe(net, {2, 3, 2}, cpus(3), options);
    losses.push_back(pipe.train_step(x, y, cross_entropy).loss);
    nets.push_back(net);
  }
  for (size_t k = 1; k < nets.size(); ++k) {
    EXPECT_TRUE(torch::equal(losses[k], losses[0])) << "spin case " << k;
    auto got = nets[k]->named_parameters(), want = nets[0]->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].value().grad(), want[i].value().grad()))
          << "spin case " << k << ": " << got[i].key();
    }
  }
}

// A failure wakes a stage that is polling for its input at once, not when
// its spin runs out: with a minute's spin the step still ends within
// seconds, with the failing stage's error.
TEST(PipelineTest, AFailureEndsAPollingWaitAtOnce) {
  namespace nn = torch::nn;
  models::Sequence net;
  net->push_back("fc1", nn::Linear(6, 8));
  net->push_back("fc2", nn::Linear(8, 8));
  net->push_back("fc3", nn::Linear(7, 3));  // wrong input width: fails on stage 2
  PipelineOptions options{4, "gpipe"};
  options.spin = std::chrono::seconds(60);
  Pipeline pipe(net, {1, 1, 1}, cpus(3), options);
  auto start = std::chrono::steady_clock::now();
  auto message = error_of([&] {
    pipe.train_step(torch::randn({8, 6}), torch::randint(3, {8}, torch::kInt64), cross_entropy);
  });
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("pipeline stage 2 (cpu): "), std::string::npos) << message;
  EXPECT_LT(seconds, 10.0) << "the stages polling for their input did not notice the failure";
}

// Every stage's thread computes with the process's intra-op thread count
// (at::set_num_threads), in OpenMP and MKL alike, from its first operation
// on; a fresh thread otherwise has their defaults (every core).
TEST(PipelineTest, StageThreadsComputeWithTheProcesssThreadCount) {
  namespace nn = torch::nn;
  testing::UnusualThreadCount threads;
  models::Sequence net;
  std::vector<testing::ThreadProbe> probes;
  for (int s = 0; s < 3; ++s) {
    probes.emplace_back();
    net->push_back("probe" + std::to_string(s), probes.back());
    net->push_back("fc" + std::to_string(s), nn::Linear(6, 6));
  }
  Pipeline pipe(net, {2, 2, 2}, cpus(3), {2, "1f1b"});
  pipe.train_step(torch::randn({4, 6}), torch::randint(6, {4}, torch::kInt64), cross_entropy);
  for (size_t s = 0; s < probes.size(); ++s) {
    ASSERT_EQ(probes[s]->seen().size(), 2u) << "stage " << s;
    for (const auto& seen : probes[s]->seen()) {
      EXPECT_EQ(seen.team.omp, threads.count()) << "stage " << s;
      EXPECT_EQ(seen.team.mkl, threads.count()) << "stage " << s;
    }
  }
}

// A model of `stages` pairs (a probe, then a Linear(6, 6)), its probes in
// `probes`.
models::Sequence probed(std::vector<testing::ThreadProbe>& probes, size_t stages) {
  namespace nn = torch::nn;
  models::Sequence net;
  for (size_t s = 0; s < stages; ++s) {
    probes.emplace_back();
    net->push_back("probe" + std::to_string(s), probes.back());
    net->push_back("fc" + std::to_string(s), nn::Linear(6, 6));
  }
  return net;
}

// Stage 0 runs on the caller's thread and every other stage on a thread
// kept across steps (Note [kept threads] in data_parallel.h).
TEST(PipelineTest, StageThreadsAreKept) {
  std::vector<testing::ThreadProbe> probes;
  auto net = probed(probes, 3);
  Pipeline pipe(net, {2, 2, 2}, cpus(3), {2, "1f1b"});
  for (int step = 0; step < 3; ++step) {
    pipe.train_step(torch::randn({4, 6}), torch::randint(6, {4}, torch::kInt64), cross_entropy);
  }
  std::set<int> all;
  for (size_t s = 0; s < probes.size(); ++s) {
    std::set<int> threads;
    for (const auto& seen : probes[s]->seen()) threads.insert(seen.thread);
    EXPECT_EQ(probes[s]->seen().size(), 6u) << "stage " << s;  // 3 steps x 2 micro-batches
    EXPECT_EQ(threads.size(), 1u) << "stage " << s;
    all.insert(threads.begin(), threads.end());
  }
  EXPECT_EQ(all.size(), 3u);
  EXPECT_TRUE(all.count(testing::thread_serial()));
}

// On a GPU every stage runs on the caller's current stream of its device.
TEST(PipelineTest, StagesRunOnTheCallersStreamOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  const torch::Device gpu(torch::kCUDA, 0);
  std::vector<testing::ThreadProbe> on_gpu;
  auto gpu_net = probed(on_gpu, 2);
  gpu_net->to(gpu);
  Pipeline gpu_pipe(gpu_net, {2, 2}, {gpu, gpu}, {2, "1f1b"});
  c10::impl::VirtualGuardImpl cuda(torch::kCUDA);
  auto side = cuda.getStreamFromGlobalPool(gpu);
  ASSERT_NE(side, cuda.getDefaultStream(gpu));
  {
    c10::StreamGuard on_side(side);
    gpu_pipe.train_step(torch::randn({4, 6}, gpu), torch::randint(6, {4}, torch::kInt64).to(gpu),
                        cross_entropy);
  }
  for (size_t s = 0; s < on_gpu.size(); ++s) {
    ASSERT_EQ(on_gpu[s]->seen().size(), 2u) << "stage " << s;
    for (const auto& seen : on_gpu[s]->seen()) EXPECT_EQ(seen.stream, side) << "stage " << s;
  }
}

TEST(PipelineTest, BadOptionsAreNamed) {
  auto net = small_convnet();
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(2), {4, "zigzag"}); }).find("--schedule"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(2), {0, "gpipe"}); }).find("--micro-batches"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Pipeline(net, {4, 3}, cpus(3), {2, "gpipe"}); }).find("2 stages but 3 devices"),
            std::string::npos);
  PipelineOptions interleaved{4, "interleaved"};
  interleaved.virtual_stages = 2;
  EXPECT_EQ(error_of([&] { Pipeline(net, {4, 3}, cpus(2), interleaved); }),
            "pipeline: 2 stages but 2 devices x --virtual-stages 2; give one device per stage");
  PipelineOptions chunked_1f1b{4, "1f1b"};
  chunked_1f1b.virtual_stages = 2;
  EXPECT_EQ(error_of([&] { Pipeline(net, {2, 2, 2, 1}, cpus(2), chunked_1f1b); }),
            "--virtual-stages 2: more than one chunk per stage needs --schedule interleaved, not 1f1b");
}

}  // namespace
}  // namespace tandem::parallel
