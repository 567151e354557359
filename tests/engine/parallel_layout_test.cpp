// The run's layout from its flags (engine/parallel_layout.h): context
// parallelism's mesh, and what it does not run on yet, refused naming
// --mesh before any worker starts.
#include <gtest/gtest.h>

#include <string>

#include "tandem/engine/parallel_layout.h"
#include "tandem/util/check.h"

namespace tandem::engine {
namespace {

TrainOptions with_mesh(const std::string& model, const std::string& mesh) {
  TrainOptions o;
  o.model = model;
  o.mesh = MeshFlag(mesh);
  return o;
}

std::string refusal(const TrainOptions& o, int64_t ranks) {
  try {
    parallel_layout(o, ranks);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(ParallelLayoutTest, ContextParallelismIsInsideTheDataDimension) {
  const auto layout = parallel_layout(with_mesh("gpt2-tiny", "dp=2,cp=2,tp=2"), 8);
  EXPECT_EQ(layout.context_ranks(), 2);
  EXPECT_EQ(layout.data_ranks(), 4);  // dp x cp: the gradients' reduction
  EXPECT_EQ(layout.mesh.dp(), 2);     // the samples' replicas
  EXPECT_TRUE(layout.split_mesh());
  auto cuda = with_mesh("gpt2-tiny", "cp=2");
  cuda.device = "cuda";
  EXPECT_EQ(refusal(cuda, 2), "--mesh cp=2: context parallelism runs on the CPU only for now (--device cuda)");
  auto dropout = with_mesh("gpt2-tiny", "cp=2");
  dropout.dropout = 0.1;
  EXPECT_EQ(refusal(dropout, 2), "--mesh cp=2: context parallelism with --dropout is not supported yet");
  EXPECT_EQ(refusal(with_mesh("resnet18", "cp=2"), 2),
            "--mesh cp=2: context parallelism splits a language model's sequences; resnet18 is an image classifier");
}

}  // namespace
}  // namespace tandem::engine
