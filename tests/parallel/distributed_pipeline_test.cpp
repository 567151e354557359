// Pipelines across ranks (Gloo on 127.0.0.1): one stage per rank,
// send/recv, against no pipeline.
#include "pipeline_fixture.h"

namespace tandem::parallel {
namespace {

// --- across ranks: one stage per rank, send/recv over Gloo ------------------

// Each rank runs its stage of the same model; the loss (on every rank) and
// each stage's gradients equal no pipeline within 1e-5.
TEST(DistributedPipelineTest, SchedulesEqualNoPipeline) {
  const std::vector<PipelineCase> cases = {
      {{4, 3}, 4, "gpipe"}, {{4, 3}, 4, "1f1b"}, {{2, 3, 2}, 3, "1f1b"}, {{2, 3, 2}, 5, "gpipe"}};
  for (const auto& c : cases) {
    std::string what = describe_split(small_convnet(), c.sizes) + " " + c.schedule;
    torch::manual_seed(13);  // outside the rank threads: they share the generator
    auto net = small_convnet();
    auto x = torch::randn({11, 1, 8, 8});
    auto y = torch::randint(5, {11}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    const int world = static_cast<int>(c.sizes.size());
    std::vector<models::Sequence> copies;
    for (int r = 0; r < world; ++r) copies.push_back(copy_of(net));  // as if each rank built it
    std::vector<double> losses(world);
    torch::Tensor outputs;
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      auto stage = split_sequence(copies[r], c.sizes)[r];
      DistributedPipeline pipe(stage, torch::kCPU, group, {c.micro_batches, c.schedule});
      EXPECT_EQ(pipe.stage_index(), r);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == world - 1 ? y : torch::Tensor(),
                                  cross_entropy);
      losses[r] = step.loss.item<double>();
      EXPECT_EQ(step.output.defined(), r == world - 1);
      ASSERT_EQ(step.stages.size(), 1u);
      EXPECT_LE(step.stages[0].max_in_flight, c.schedule == "1f1b" ? world - r : c.micro_batches);
      torch::NoGradGuard no_grad;
      auto out = pipe.forward(r == 0 ? x : torch::Tensor());
      EXPECT_EQ(out.defined(), r == world - 1);
      if (out.defined()) outputs = out;
    }));
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::allclose(outputs, reference->forward(x), 1e-5, 1e-6)) << what;
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << what << " rank " << r;
      auto mine = split_sequence(copies[r], c.sizes)[r];
      auto theirs = split_sequence(reference, c.sizes)[r];
      expect_same_gradients(*mine, *theirs, 1e-5, what + " rank " + std::to_string(r));
    }
  }
}

// Interleaved across ranks: rank r holds pieces r, r + S, ...; the last
// rank's activations reach rank 0's next chunk (and gradients come back)
// over groups of their own, and on one rank every hand-off stays in
// memory. Loss and gradients equal no pipeline within 1e-5.
TEST(DistributedPipelineTest, InterleavedEqualsNoPipeline) {
  struct Case {
    std::vector<int64_t> sizes;
    int world;
    int64_t micro_batches;
  };
  const std::vector<Case> cases = {{{2, 2, 2, 1}, 2, 4}, {{1, 1, 2, 1, 1, 1}, 3, 5}, {{3, 2, 2}, 1, 3},
                                   {{1, 1, 2, 1, 1, 1}, 2, 2}};
  for (const auto& c : cases) {
    const int64_t chunks = static_cast<int64_t>(c.sizes.size()) / c.world;
    std::string what = describe_split(small_convnet(), c.sizes) + " over " + std::to_string(c.world) +
                       " ranks, m=" + std::to_string(c.micro_batches);
    torch::manual_seed(19);
    auto net = small_convnet();
    auto x = torch::randn({10, 1, 8, 8});
    auto y = torch::randint(5, {10}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    std::vector<models::Sequence> copies;
    for (int r = 0; r < c.world; ++r) copies.push_back(copy_of(net));
    std::vector<double> losses(c.world);
    torch::Tensor outputs;
    auto mine = [&](int r) {  // rank r's chunks of its copy
      auto pieces = split_sequence(copies[r], c.sizes);
      std::vector<models::Sequence> out;
      for (size_t k = r; k < pieces.size(); k += c.world) out.push_back(pieces[k]);
      return out;
    };
    testing::expect_no_errors(testing::run_ranks(c.world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      PipelineOptions options{c.micro_batches, "interleaved"};
      options.virtual_stages = chunks;
      DistributedPipeline pipe(mine(r), torch::kCPU, group, options);
      auto step = pipe.train_step(r == 0 ? x : torch::Tensor(), r == c.world - 1 ? y : torch::Tensor(),
                                  cross_entropy);
      losses[r] = step.loss.item<double>();
      EXPECT_EQ(step.output.defined(), r == c.world - 1);
      ASSERT_EQ(step.stages.size(), 1u);
      EXPECT_EQ(step.stages[0].actions, interleaved_schedule(c.world, c.micro_batches, chunks).actions[r]);
      // Evaluation: the whole batch through the pieces, the output on the last rank.
      torch::NoGradGuard no_grad;
      auto out = pipe.forward(r == 0 ? x : torch::Tensor());
      EXPECT_EQ(out.defined(), r == c.world - 1);
      if (out.defined()) outputs = out;
    }));
    {
      torch::NoGradGuard no_grad;
      EXPECT_TRUE(torch::allclose(outputs, reference->forward(x), 1e-5, 1e-6)) << what;
    }
    auto theirs = split_sequence(reference, c.sizes);
    for (int r = 0; r < c.world; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << what << " rank " << r;
      auto chunks_of_r = mine(r);
      for (size_t j = 0; j < chunks_of_r.size(); ++j) {
        expect_same_gradients(*chunks_of_r[j], *theirs[r + j * c.world], 1e-5,
                              what + " rank " + std::to_string(r) + " chunk " + std::to_string(j));
      }
    }
  }
}

// Note [reducing during the last backward]: before_last_backward(c) comes
// once per chunk, when all of c's backwards but the last have run (its
// gradients then lack exactly one micro-batch), under every schedule.
TEST(DistributedPipelineTest, EachChunksLastBackwardIsAnnouncedBeforeItRuns) {
  const int world = 2;
  const int64_t m = 4;
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
    const int64_t chunks = schedule == "interleaved" ? 2 : 1;
    torch::manual_seed(23);
    models::Sequence net;  // a parameter in every piece
    for (int k = 0; k < 4; ++k) net->push_back("fc" + std::to_string(k), torch::nn::Linear(6, 6));
    auto x = torch::randn({8, 6});
    auto y = torch::randint(6, {8}, torch::kInt64);
    const std::vector<int64_t> sizes = chunks == 2 ? std::vector<int64_t>{1, 1, 1, 1} : std::vector<int64_t>{2, 2};
    std::vector<models::Sequence> copies;
    for (int r = 0; r < world; ++r) copies.push_back(copy_of(net));
    std::vector<std::vector<int>> backwards(world, std::vector<int>(chunks)), announced(world, std::vector<int>(chunks));
    std::vector<std::vector<int>> backwards_when_announced(world, std::vector<int>(chunks, -1));
    testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
      const auto r = group->rank();
      auto pieces = split_sequence(copies[r], sizes);
      std::vector<models::Sequence> mine;
      for (size_t k = r; k < pieces.size(); k += world) mine.push_back(pieces[k]);
      for (int64_t c = 0; c < chunks; ++c) {
        mine[c]->parameters().front().register_hook([&backwards, r, c](torch::Tensor g) {
          ++backwards[r][c];
          return g;
        });
      }
      PipelineOptions options{m, schedule};
      options.virtual_stages = chunks;
      options.before_last_backward = [&, r](int64_t c) {
        ++announced[r][c];
        backwards_when_announced[r][c] = backwards[r][c];
      };
      DistributedPipeline pipe(mine, torch::kCPU, group, options);
      pipe.train_step(r == 0 ? x : torch::Tensor(), r == world - 1 ? y : torch::Tensor(), cross_entropy);
    }));
    for (int r = 0; r < world; ++r) {
      for (int64_t c = 0; c < chunks; ++c) {
        SCOPED_TRACE(schedule + " rank " + std::to_string(r) + " chunk " + std::to_string(c));
        EXPECT_EQ(announced[r][c], 1);
        EXPECT_EQ(backwards_when_announced[r][c], m - 1);
        EXPECT_EQ(backwards[r][c], m);
      }
    }
  }
}

TEST(DistributedPipelineTest, ChunksMustMatchTheVirtualStages) {
  auto net = small_convnet();
  auto errors = testing::run_ranks(1, [&](std::shared_ptr<dist::ProcessGroup> group) {
    PipelineOptions options{2, "interleaved"};
    options.virtual_stages = 3;
    DistributedPipeline pipe(split_sequence(net, {4, 3}), torch::kCPU, group, options);
  });
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0], "distributed pipeline: 2 chunk(s) on this rank but --virtual-stages 3");
}

// A batch of fewer rows than micro-batches (an epoch's short last batch)
// takes one micro-batch per row on every stage, as in one process: the
// loss and gradients equal no pipeline's, whether the middle stage learns
// the rows from the batch or from `rows`.
TEST(DistributedPipelineTest, FewerRowsThanMicroBatchesUseOneEach) {
  for (bool rows_given : {false, true}) {
    torch::manual_seed(17);
    auto net = small_convnet();
    auto x = torch::randn({3, 1, 8, 8});
    auto y = torch::randint(5, {3}, torch::kInt64);
    auto reference = copy_of(net);
    auto want = cross_entropy(reference->forward(x), y);
    want.backward();
    const std::vector<int64_t> sizes{2, 3, 2};
    std::vector<models::Sequence> copies;
    for (int r = 0; r < 3; ++r) copies.push_back(copy_of(net));
    std::vector<double> losses(3);
    testing::expect_no_errors(testing::run_ranks(3, [&](std::shared_ptr<dist::ProcessGroup> group) {
      auto r = group->rank();
      DistributedPipeline pipe(split_sequence(copies[r], sizes)[r], torch::kCPU, group, {4, "1f1b"});
      // The middle stage: the whole batch, or nothing but its rows.
      auto input = r == 0 || (r == 1 && !rows_given) ? x : torch::Tensor();
      auto step = pipe.train_step(input, r == 2 ? y : torch::Tensor(), cross_entropy, {}, r == 1 && rows_given ? 3 : 0);
      EXPECT_EQ(step.micro_batches, 3);
      losses[r] = step.loss.item<double>();
    }, dist::GroupOptions{"gloo", "cpu", std::chrono::seconds(20)}));
    for (int r = 0; r < 3; ++r) {
      EXPECT_NEAR(losses[r], want.item<double>(), 1e-5 * want.item<double>()) << "rank " << r;
      expect_same_gradients(*split_sequence(copies[r], sizes)[r], *split_sequence(reference, sizes)[r], 1e-5,
                            "rank " + std::to_string(r) + (rows_given ? ", rows given" : ""));
    }
  }
}

}  // namespace
}  // namespace tandem::parallel
