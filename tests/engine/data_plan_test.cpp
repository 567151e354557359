// The data plans composed with a pipeline over ranks, as the Trainer
// composes them under a mesh (engine/data_plan.h): four thread ranks as
// dp=2 x pp=2 over Gloo, in float64, against one process.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tandem/dist/device_mesh.h"
#include "tandem/engine/data_plan.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/parallel/stage_split.h"
#include "testing.h"

namespace tandem::engine {
namespace {

torch::Tensor cross_entropy(const torch::Tensor& out, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(out, target);
}

struct ReplicaStep {
  int64_t bytes_before_the_end = 0;  // all-reduced by the dp ranks when the pipeline's step returned
  int64_t gradient_bytes = 0;        // this rank's chunks' gradients
};

// One training step of a dp=2 x pp=2 mesh with DDP over each stage's dp
// group, `announce`: the pipeline tells the plan of each chunk's last
// backward. Returns each rank's copy of the model (its own chunks hold the
// averaged gradients) and what each rank's dp group carried.
std::pair<std::vector<models::Sequence>, std::vector<ReplicaStep>> mesh_step(
    const models::Sequence& net, const std::string& schedule, const torch::Tensor& x, const torch::Tensor& y,
    bool announce) {
  const int world = 4;
  const int64_t chunks = schedule == "interleaved" ? 2 : 1;
  const std::vector<int64_t> sizes = chunks == 2 ? std::vector<int64_t>{1, 1, 1, 1} : std::vector<int64_t>{2, 2};
  std::vector<models::Sequence> copies;
  for (int r = 0; r < world; ++r) copies.push_back(std::dynamic_pointer_cast<models::SequenceImpl>(net->clone()));
  std::vector<ReplicaStep> steps(world);
  TrainOptions options;
  options.strategy = Strategy::kDdp;
  testing::expect_no_errors(testing::run_ranks(world, [&](std::shared_ptr<dist::ProcessGroup> group) {
    const auto r = group->rank();
    dist::DeviceMesh mesh(group, dist::parse_mesh("dp=2,pp=2", world));
    const auto& stages = mesh.group(dist::MeshDim::kPipeline);
    const auto& replicas = mesh.group(dist::MeshDim::kData);
    auto pieces = parallel::split_sequence(copies[r], sizes);
    std::vector<models::Sequence> mine;
    for (size_t k = stages->rank(); k < pieces.size(); k += 2) mine.push_back(pieces[k]);
    DataPlanSetup setup;
    setup.options = &options;
    setup.layout.mesh = mesh.shape();
    setup.layout.pipeline = true;
    setup.layout.data = DataParallelism::kDdp;
    setup.model = copies[r];
    setup.pieces = mine;
    setup.group = replicas;
    setup.data_ranks = 2;
    auto plan = make_data_plan(setup);
    EXPECT_EQ(plan->name(), "ddp");
    parallel::PipelineOptions pipeline_options{4, schedule};
    pipeline_options.virtual_stages = chunks;
    if (announce) pipeline_options.before_last_backward = [&plan](int64_t chunk) { plan->before_last_backward(chunk); };
    parallel::DistributedPipeline pipe(mine, torch::kCPU, stages, pipeline_options);
    torch::optim::SGD optimizer(copies[r]->parameters(), torch::optim::SGDOptions(0.1));
    // Each replica pipeline takes its half of the batch.
    const auto half = replicas->rank();
    auto inputs = x.chunk(2)[half], targets = y.chunk(2)[half];
    plan->begin_step(optimizer);
    replicas->reset_traffic();
    Held micro_batches = plan->begin_micro_batches();
    pipe.train_step(stages->rank() == 0 ? inputs : torch::Tensor(), stages->rank() == 1 ? targets : torch::Tensor(),
                    cross_entropy);
    steps[r].bytes_before_the_end = replicas->traffic()["all_reduce"].bytes;
    plan->end_micro_batches();
    micro_batches.reset();
    plan->after_backward();
    for (const auto& piece : mine) {
      for (const auto& p : piece->parameters()) steps[r].gradient_bytes += p.numel() * p.element_size();
    }
  }));
  return {copies, steps};
}

// Note [reducing during the last backward]: DDP over a stage's replicas
// all-reduces every gradient bucket during the chunks' last backwards,
// before the pipeline's step returns, and the averaged gradients are one
// process's on the whole batch to rounding; without the announcement
// (the control) nothing is reduced until the step's end.
TEST(DataPlanTest, DdpUnderAPipelineReducesDuringTheLastBackwards) {
  for (const std::string schedule : {"gpipe", "1f1b", "interleaved"}) {
    SCOPED_TRACE(schedule);
    torch::manual_seed(29);
    models::Sequence net;
    for (int k = 0; k < 4; ++k) net->push_back("fc" + std::to_string(k), torch::nn::Linear(6, 6));
    net->to(torch::kFloat64);
    auto x = torch::randn({16, 6}, torch::kFloat64);
    auto y = torch::randint(6, {16}, torch::kInt64);
    auto reference = std::dynamic_pointer_cast<models::SequenceImpl>(net->clone());
    cross_entropy(reference->forward(x), y).backward();

    auto [copies, steps] = mesh_step(net, schedule, x, y, /*announce=*/true);
    for (int r = 0; r < 4; ++r) {
      EXPECT_GT(steps[r].gradient_bytes, 0);
      EXPECT_EQ(steps[r].bytes_before_the_end, steps[r].gradient_bytes) << "rank " << r;
    }
    // Each layer's gradient from the ranks that hold it (rank = pp * 2 + dp).
    const int64_t chunks = schedule == "interleaved" ? 2 : 1;
    const auto want = reference->named_parameters();
    for (int r = 0; r < 4; ++r) {
      const auto got = copies[r]->named_parameters();
      const int64_t stage = r / 2;
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t layer = static_cast<int64_t>(i) / 2;  // a weight and a bias each
        const int64_t piece = chunks == 2 ? layer : layer / 2;
        if (piece % 2 != stage) continue;
        ASSERT_TRUE(got[i].value().grad().defined()) << got[i].key();
        EXPECT_TRUE(torch::allclose(got[i].value().grad(), want[i].value().grad(), 1e-12, 1e-14))
            << "rank " << r << " " << got[i].key();
      }
    }

    auto control = mesh_step(net, schedule, x, y, /*announce=*/false).second;
    for (int r = 0; r < 4; ++r) EXPECT_EQ(control[r].bytes_before_the_end, 0) << "rank " << r;
  }
}

}  // namespace
}  // namespace tandem::engine
