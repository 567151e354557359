// Pipeline parallelism in one process: a model split over devices (seed
// 003), and GPipe / 1F1B / interleaved 1F1B with one thread per stage
// against no pipeline.
#include "pipeline_fixture.h"

namespace tandem::parallel {
namespace {

// --- seed 003: a model whose parts live on different devices -----------------

// An embedding computed on one device, the rest on another: outputs and
// gradients equal the unsplit model's within `tolerance`, and training
// moves along.
void check_embedding_on_one_device_the_rest_on_another(std::vector<torch::Device> devices, double tolerance) {
  torch::manual_seed(3);
  models::Sequence net;
  net->push_back("embedding", torch::nn::Embedding(1000, 10));
  net->push_back("rnn", torch::nn::Linear(10, 10));
  auto whole = copy_of(net);
  ModelParallel split(split_sequence(net, {1, 1}), devices);
  EXPECT_EQ(split->stages()[1]->parameters()[0].device(), devices[1]);
  torch::optim::SGD sgd_split(split->parameters(), 0.5), sgd_whole(whole->parameters(), 0.5);
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randint(1000, {16, 5}, torch::kInt64);
    auto out_split = split->forward(x);
    auto out_whole = whole->forward(x);
    EXPECT_EQ(out_split.device(), devices[1]);
    EXPECT_TRUE(torch::allclose(out_split.cpu(), out_whole, tolerance, tolerance));
    sgd_split.zero_grad();
    sgd_whole.zero_grad();
    out_split.pow(2).mean().backward();
    out_whole.pow(2).mean().backward();
    expect_same_gradients(*split, *whole, tolerance, "step " + std::to_string(step));
    sgd_split.step();
    sgd_whole.step();
  }
  EXPECT_NE(error_of([&] { ModelParallel(split_sequence(net, {1, 1}), cpus(3)); })
                .find("2 stages but 3 devices"),
            std::string::npos);
}

// On two CPUs it is exact.
TEST(ModelParallelTest, EmbeddingOnOneDeviceTheRestOnAnother) {
  check_embedding_on_one_device_the_rest_on_another({torch::kCPU, torch::kCPU}, 1e-6);
}

// The rest on cuda:0: another device's arithmetic rounds differently, so
// within 1e-5.
TEST(ModelParallelTest, EmbeddingOnTheCpuTheRestOnTheGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_embedding_on_one_device_the_rest_on_another({torch::kCPU, torch::Device(torch::kCUDA, 0)}, 1e-5);
}

// --- one process, one thread per stage ---------------------------------------



// GPipe and 1F1B give the loss and gradients of no pipeline within
// `tolerance`, for 2 and 3 stages and micro-batch counts that do and do not
// divide the batch, every stage and the unsplit model on `place`; the
// outputs come back in the batch's order.
void check_schedules_equal_no_pipeline(torch::Device place, double tolerance) {
  const std::vector<PipelineCase> cases = {
      {{4, 3}, 1, "gpipe"}, {{4, 3}, 4, "gpipe"}, {{4, 3}, 4, "1f1b"}, {{2, 3, 2}, 3, "1f1b"},
      {{2, 3, 2}, 5, "gpipe"}, {{1, 1, 3, 2}, 8, "1f1b"}, {{4, 3}, 16, "1f1b"}};
  for (const auto& c : cases) {
    std::string what = describe_split(small_convnet(), c.sizes) + " " + c.schedule + " m=" +
                       std::to_string(c.micro_batches) + " on " + place.str();
    torch::manual_seed(11);
    auto net = small_convnet();
    auto reference = copy_of(net);
    reference->to(place);
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    Pipeline pipe(net, c.sizes, std::vector<torch::Device>(c.sizes.size(), place),
                  {c.micro_batches, c.schedule});
    auto step = pipe.train_step(x.to(place), y.to(place), cross_entropy);
    auto out = reference->forward(x.to(place));
    auto loss = cross_entropy(out, y.to(place));
    loss.backward();
    EXPECT_EQ(step.micro_batches, std::min<int64_t>(c.micro_batches, 12)) << what;
    EXPECT_NEAR(step.loss.item<double>(), loss.item<double>(), tolerance * loss.item<double>()) << what;
    EXPECT_TRUE(torch::allclose(step.output.cpu(), out.detach().cpu(), tolerance, tolerance / 10)) << what;
    expect_same_gradients(*net, *reference, tolerance, what);
  }
}

// On the CPU within 1e-5.
TEST(PipelineTest, SchedulesEqualNoPipeline) { check_schedules_equal_no_pipeline(torch::kCPU, 1e-5); }

// Every stage on cuda:0 (issue 5's cuda:0,cuda:0 check) against the unsplit
// model on cuda:0: the same kernels, other batch sizes, so within 1e-4.
TEST(PipelineTest, SchedulesEqualNoPipelineOnOneGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_schedules_equal_no_pipeline(torch::Device(torch::kCUDA, 0), 1e-4);
}

// Interleaved 1F1B: S devices, V chunks each (the model cut into S * V
// pieces, piece k on device k % S) give the loss, outputs and gradients of
// no pipeline within `tolerance`, for micro-batch counts that are and are
// not multiples of S; each stage ran its schedule's actions in order and
// held no more chunk-micro-batches than the schedule says. Every device and
// the unsplit model are `place`.
void check_interleaved_equals_no_pipeline(torch::Device place, double tolerance) {
  struct Case {
    std::vector<int64_t> sizes;
    int64_t devices, micro_batches;
  };
  const std::vector<Case> cases = {{{2, 2, 2, 1}, 2, 4}, {{2, 2, 2, 1}, 2, 3}, {{1, 1, 2, 1, 1, 1}, 3, 6},
                                   {{1, 1, 2, 1, 1, 1}, 2, 5}, {{3, 2, 2}, 1, 4}};
  for (const auto& c : cases) {
    const int64_t chunks = static_cast<int64_t>(c.sizes.size()) / c.devices;
    std::string what = describe_split(small_convnet(), c.sizes) + " over " + std::to_string(c.devices) +
                       " devices, m=" + std::to_string(c.micro_batches) + " on " + place.str();
    torch::manual_seed(17);
    auto net = small_convnet();
    auto reference = copy_of(net);
    reference->to(place);
    auto x = torch::randn({12, 1, 8, 8});
    auto y = torch::randint(5, {12}, torch::kInt64);
    PipelineOptions options{c.micro_batches, "interleaved"};
    options.virtual_stages = chunks;
    Pipeline pipe(net, c.sizes, std::vector<torch::Device>(c.devices, place), options);
    ASSERT_EQ(pipe.devices().size(), static_cast<size_t>(c.devices));
    ASSERT_EQ(pipe.pieces().size(), c.sizes.size());
    auto step = pipe.train_step(x.to(place), y.to(place), cross_entropy);
    auto out = reference->forward(x.to(place));
    auto loss = cross_entropy(out, y.to(place));
    loss.backward();
    EXPECT_NEAR(step.loss.item<double>(), loss.item<double>(), tolerance * loss.item<double>()) << what;
    EXPECT_TRUE(torch::allclose(step.output.cpu(), out.detach().cpu(), tolerance, tolerance / 10)) << what;
    expect_same_gradients(*net, *reference, tolerance, what);
    auto plan = interleaved_schedule(c.devices, c.micro_batches, chunks);
    auto sim = simulate(plan);
    ASSERT_EQ(step.stages.size(), static_cast<size_t>(c.devices));
    for (int64_t s = 0; s < c.devices; ++s) {
      EXPECT_EQ(step.stages[s].actions, plan.actions[s]) << what << " stage " << s;
      EXPECT_EQ(step.stages[s].max_in_flight, sim.max_in_flight[s]) << what << " stage " << s;
    }
    // Evaluation runs the whole batch through the pieces in model order.
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(torch::allclose(pipe.forward(x.to(place)).cpu(), out.detach().cpu(), tolerance,
                                tolerance / 10)) << what;
  }
}

// On the CPU within 1e-5.
TEST(PipelineTest, InterleavedEqualsNoPipeline) { check_interleaved_equals_no_pipeline(torch::kCPU, 1e-5); }

// Every device cuda:0: the same kernels, other batch sizes, so within 1e-4.
TEST(PipelineTest, InterleavedEqualsNoPipelineOnOneGpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs a CUDA device";
  check_interleaved_equals_no_pipeline(torch::Device(torch::kCUDA, 0), 1e-4);
}

// A batch that requires grad gets its gradient, as from the unsplit model:
// a leaf batch in its .grad, and a batch computed by an upstream layer in
// that layer's parameters (one backward through the upstream graph, which
// frees its saved tensors after the first pass). Threads and two ranks.
TEST(PipelineTest, TheBatchsGradientReachesTheCallersGraph) {
  torch::manual_seed(23);
  auto net = small_convnet();
  auto upstream = torch::nn::Linear(16, 64);
  auto z = torch::randn({12, 16});
  auto y = torch::randint(5, {12}, torch::kInt64);
  auto reference = copy_of(net);
  auto reference_up = std::dynamic_pointer_cast<torch::nn::LinearImpl>(upstream->clone());
  auto leaf = torch::randn({12, 1, 8, 8}).requires_grad_(true);
  auto leaf_ref = leaf.detach().clone().requires_grad_(true);
  cross_entropy(reference->forward(reference_up->forward(z).view({12, 1, 8, 8})), y).backward();
  cross_entropy(reference->forward(leaf_ref), y).backward();
  for (std::string schedule : {"gpipe", "1f1b"}) {
    net->zero_grad();
    upstream->zero_grad();
    leaf.mutable_grad() = torch::Tensor();
    Pipeline pipe(net, {3, 4}, cpus(2), {4, schedule});
    pipe.train_step(upstream->forward(z).view({12, 1, 8, 8}), y, cross_entropy);
    pipe.train_step(leaf, y, cross_entropy);
    expect_same_gradients(*net, *reference, 1e-5, schedule);
    expect_same_gradients(*upstream, *reference_up, 1e-5, schedule + " upstream");
    ASSERT_TRUE(leaf.grad().defined()) << schedule;
    EXPECT_TRUE(torch::allclose(leaf.grad(), leaf_ref.grad(), 1e-5, 1e-7)) << schedule;
  }
  // Over two ranks: rank 0 holds the upstream layer and the first stage.
  auto copies = std::vector<models::Sequence>{copy_of(net), copy_of(net)};
  upstream->zero_grad();
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    auto stage = split_sequence(copies[r], {3, 4})[r];
    DistributedPipeline pipe(stage, torch::kCPU, group, {4, "1f1b"});
    for (auto& p : stage->parameters()) p.mutable_grad() = torch::Tensor();
    pipe.train_step(r == 0 ? upstream->forward(z).view({12, 1, 8, 8}) : torch::Tensor(),
                    r == 1 ? y : torch::Tensor(), cross_entropy);
  }));
  expect_same_gradients(*upstream, *reference_up, 1e-5, "two ranks upstream");
}

// Gradients accumulate across steps like any backward; an optimizer step
// after each keeps pipeline and reference together.
TEST(PipelineTest, TrainingStepsEqualNoPipeline) {
  torch::manual_seed(5);
  auto net = small_convnet();
  auto reference = copy_of(net);
  Pipeline pipe(net, {3, 4}, cpus(2), {4, "1f1b"});
  torch::optim::SGD a(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  torch::optim::SGD b(reference->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  for (int step = 0; step < 5; ++step) {
    auto x = torch::randn({10, 1, 8, 8});
    auto y = torch::randint(5, {10}, torch::kInt64);
    a.zero_grad();
    b.zero_grad();
    pipe.train_step(x, y, cross_entropy);
    cross_entropy(reference->forward(x), y).backward();
    a.step();
    b.step();
  }
  for (const auto& p : net->named_parameters()) {
    auto want = reference->named_parameters()[p.key()];
    EXPECT_TRUE(torch::allclose(p.value(), want, 1e-5, 1e-6)) << p.key();
  }
  // forward(): the whole batch through the stages, as the unsplit model.
  auto x = torch::randn({6, 1, 8, 8});
  EXPECT_TRUE(torch::allclose(pipe.forward(x), reference->forward(x), 1e-5, 1e-6));
}

// --amp in a pipeline: each stage's forward ran under bf16 autocast (the
// last stage's output is bf16), backward outside it, and the gradients agree
// with the unsplit model under the same autocast to bf16's precision; in one
// process and over two ranks.
TEST(PipelineTest, AutocastRunsEachMicroBatchForwardInBf16) {
  torch::manual_seed(17);
  auto net = small_convnet();
  auto reference = copy_of(net);
  auto x = torch::randn({12, 1, 8, 8});
  auto y = torch::randint(5, {12}, torch::kInt64);
  torch::Tensor want;
  {
    optim::AutocastGuard autocast(torch::kCPU, torch::kBFloat16);
    want = cross_entropy(reference->forward(x), y);
  }
  want.backward();
  for (std::string schedule : {"gpipe", "1f1b"}) {
    auto mine = copy_of(net);
    Pipeline pipe(mine, {3, 4}, cpus(2), {3, schedule, torch::kBFloat16});
    auto step = pipe.train_step(x, y, cross_entropy);
    EXPECT_EQ(step.output.scalar_type(), torch::kBFloat16) << schedule;
    EXPECT_EQ(step.loss.scalar_type(), torch::kFloat32) << schedule;  // losses autocast to float32
    EXPECT_NEAR(step.loss.item<double>(), want.item<double>(), 2e-2 * want.item<double>()) << schedule;
    for (const auto& p : mine->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
    expect_same_gradients(*mine, *reference, 5e-2, "bf16 " + schedule);
  }
  std::vector<models::Sequence> copies{copy_of(net), copy_of(net)};
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    DistributedPipeline pipe(split_sequence(copies[r], {3, 4})[r], torch::kCPU, group,
                             {3, "1f1b", torch::kBFloat16});
    auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == 1 ? y : torch::Tensor(), cross_entropy);
    EXPECT_NEAR(step.loss.item<double>(), want.item<double>(), 2e-2 * want.item<double>()) << "rank " << r;
    if (r == 1) EXPECT_EQ(step.output.scalar_type(), torch::kBFloat16);
  }));
  for (int r = 0; r < 2; ++r) {
    expect_same_gradients(*split_sequence(copies[r], {3, 4})[r], *split_sequence(reference, {3, 4})[r],
                          5e-2, "bf16 over ranks, stage " + std::to_string(r));
  }
}

// PipelineOptions::recompute (GPipe's re-materialization): every stage
// keeps only its micro-batches' inputs and recomputes the forward before
// the backward, under the same autocast: the loss and the gradients of the
// step without it, bit for bit, with either schedule, in float32 and bf16,
// in one process and over 2 ranks.
TEST(PipelineTest, RecomputingStagesGiveTheSameStepBitForBit) {
  torch::manual_seed(29);
  auto net = small_convnet();
  auto x = torch::randn({12, 1, 8, 8});
  auto y = torch::randint(5, {12}, torch::kInt64);
  auto expect_same_step = [](const models::Sequence& a, const models::Sequence& b, const torch::Tensor& loss_a,
                             const torch::Tensor& loss_b, const std::string& what) {
    EXPECT_TRUE(torch::equal(loss_a, loss_b)) << what;
    auto got = a->named_parameters(), want = b->named_parameters();
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_TRUE(torch::equal(got[i].value().grad(), want[i].value().grad())) << what << ": " << got[i].key();
    }
  };
  for (std::string schedule : {"gpipe", "1f1b"}) {
    for (std::optional<torch::ScalarType> autocast : {std::optional<torch::ScalarType>(), std::optional(torch::kBFloat16)}) {
      const std::string what = schedule + (autocast ? " bf16" : " float32");
      auto plain = copy_of(net), recomputed = copy_of(net);
      PipelineOptions options{4, schedule, autocast};
      Pipeline plain_pipe(plain, {3, 4}, cpus(2), options);
      options.recompute = true;
      Pipeline recomputing_pipe(recomputed, {3, 4}, cpus(2), options);
      auto a = plain_pipe.train_step(x, y, cross_entropy), b = recomputing_pipe.train_step(x, y, cross_entropy);
      expect_same_step(plain, recomputed, a.loss, b.loss, what);
    }
  }
  std::vector<models::Sequence> plain{copy_of(net), copy_of(net)}, recomputed{copy_of(net), copy_of(net)};
  std::vector<torch::Tensor> losses(4);
  testing::expect_no_errors(testing::run_ranks(2, [&](std::shared_ptr<dist::ProcessGroup> group) {
    auto r = group->rank();
    for (bool recompute : {false, true}) {
      auto& copies = recompute ? recomputed : plain;
      PipelineOptions options{3, "1f1b"};
      options.recompute = recompute;
      DistributedPipeline pipe(split_sequence(copies[r], {3, 4})[r], torch::kCPU, group, options);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == 1 ? y : torch::Tensor(), cross_entropy);
      if (r == 1) losses[recompute] = step.loss;
    }
  }));
  for (int r = 0; r < 2; ++r) {
    expect_same_step(split_sequence(plain[r], {3, 4})[r], split_sequence(recomputed[r], {3, 4})[r], losses[0],
                     losses[1], "over 2 ranks, stage " + std::to_string(r));
  }
  // And the recomputation happens: each stage's forward runs twice per
  // micro-batch (a counting identity at the head of each stage).
  for (bool recompute : {false, true}) {
    models::Sequence counted;
    ForwardCount first, second;
    counted->push_back("count1", first);
    counted->push_back("fc1", torch::nn::Linear(4, 4));
    counted->push_back("count2", second);
    counted->push_back("fc2", torch::nn::Linear(4, 5));
    PipelineOptions options{3, "gpipe"};
    options.recompute = recompute;
    Pipeline pipe(counted, {2, 2}, cpus(2), options);
    pipe.train_step(torch::randn({6, 4}), torch::randint(5, {6}, torch::kInt64), cross_entropy);
    EXPECT_EQ(first->calls.load(), recompute ? 6 : 3);
    EXPECT_EQ(second->calls.load(), recompute ? 6 : 3);
  }
}

// A loss scale (fp16's GradScaler) multiplies what backward starts from, not
// the reported loss: with a power of two every gradient is exactly that
// multiple of the unscaled one.
TEST(PipelineTest, ALossScaleScalesEveryGradientExactly) {
  torch::manual_seed(19);
  auto net = small_convnet();
  auto scaled = copy_of(net);
  auto x = torch::randn({10, 1, 8, 8});
  auto y = torch::randint(5, {10}, torch::kInt64);
  Pipeline plain(net, {3, 4}, cpus(2), {4, "1f1b"});
  Pipeline pipe(scaled, {3, 4}, cpus(2), {4, "1f1b"});
  auto a = plain.train_step(x, y, cross_entropy);
  auto b = pipe.train_step(x, y, cross_entropy, [](const torch::Tensor& loss) { return loss * 1024; });
  EXPECT_EQ(a.loss.item<double>(), b.loss.item<double>());
  auto want = net->named_parameters();
  for (const auto& p : scaled->named_parameters()) {
    EXPECT_TRUE(torch::equal(p.value().grad(), want[p.key()].grad() * 1024)) << p.key();
  }
}

// Measured on the running executor, not the simulation: 1F1B holds at most
// S - s micro-batches on stage s (never more than the number of stages);
// GPipe holds all M. Each stage ran every F and B once, in schedule order.

}  // namespace
}  // namespace tandem::parallel
