// Every layout of today's dimensions, generated, against one process:
// each data strategy (DDP, seed 004's all-reduce, ZeRO-1, FSDP as ZeRO-3
// and as ZeRO-2, HSDP over 2 x 2) times each pipeline (none, pp=2 with
// 1F1B, pp=2 interleaved over 2 virtual stages) times tp (1, 2, and 2 with
// sequence parallelism): 54 layouts, each trained 3 steps of 16 windows in
// float64 with its ranks as threads (up to 16), every weight within 1e-10
// of the one-process run (a control run with another setting fails it).
// Each layout runs one of two models, gpt2-tiny (tied embedding, AdamW,
// clipping) or llama-tiny (untied, grouped-query heads, SGD with label
// smoothing), alternating like a chessboard's squares over the pipeline x
// tp grid and flipped from one strategy to the next: every model meets
// every strategy, every pipeline and every tp in each strategy, at half
// the runs of both models on every layout. And a sample of resumes: in
// each data strategy one layout's checkpoint at step 2, resumed under
// another drawn at random, ends there too. One test per data strategy,
// naming each layout (and the resumed pair) it checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace matrix_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

constexpr testing::RunStyle kSteps{/*threads=*/true, /*steps=*/3};
constexpr double kTolerance = 1e-10;

struct Strategy {
  const char* name;
  const char* flags;  // after --strategy
  int dp;             // data-parallel ranks
  bool hsdp;          // dp laid out as dp_replicate=2,dp_shard=2
};
const Strategy kStrategies[] = {
    {"ddp", "ddp", 2, false},
    {"allreduce", "allreduce", 2, false},
    {"zero1", "ddp --shard-optimizer", 2, false},
    {"fsdp", "fsdp", 2, false},
    {"fsdp_grad_op", "fsdp --fsdp-sharding grad-op", 2, false},
    {"hsdp", "fsdp", 4, true},
};

struct Pipeline {
  const char* name;
  int pp;
  const char* flags;
};
const Pipeline kPipelines[] = {{"pp1", 1, ""}, {"pp2_1f1b", 2, " --schedule 1f1b"},
                               {"pp2_interleaved", 2, " --schedule interleaved --virtual-stages 2"}};

struct Tensor {
  const char* name;
  int tp;
  const char* flags;
};
const Tensor kTensors[] = {{"tp1", 1, ""}, {"tp2", 2, ""}, {"tp2_sp", 2, " --sequence-parallel"}};

struct Model {
  const char* name;
  std::string flags;    // after the data
  std::string control;  // a setting that must fail the bound
};

Model model(const std::string& name) {
  if (name == "gpt2") return {"gpt2", "--model gpt2-tiny --seq-len 16 --batch-size 16 --dtype float64 --lr 1e-3 --clip-grad-norm 0.5",
                              " --beta2 0.99"};
  return {"llama", "--model llama-tiny --seq-len 16 --batch-size 16 --dtype float64 --optimizer sgd --lr 0.05 "
          "--label-smoothing 0.1",
          " --momentum 0.5"};
}

// The flags of one layout: its ranks, mesh and strategy.
std::string layout_flags(const Strategy& s, const Pipeline& p, const Tensor& t) {
  std::string mesh = p.pp > 1 ? "pp=" + std::to_string(p.pp) + "," : "";
  mesh += s.hsdp ? "dp_replicate=2,dp_shard=2" : "dp=" + std::to_string(s.dp);
  if (t.tp > 1) mesh += ",tp=" + std::to_string(t.tp);
  const int ranks = s.dp * p.pp * t.tp;
  return "--nproc-per-node " + std::to_string(ranks) + " --mesh " + mesh + " --strategy " + s.flags + p.flags +
         t.flags;
}

std::string layout_name(const Strategy& s, const Pipeline& p, const Tensor& t) {
  return std::string(s.name) + "/" + p.name + "/" + t.name;
}

// One model's reference, trained once per test process.
struct Reference {
  TempDir dir;
  std::string data;
  bool trained = false;
};
Reference& reference(const Model& m) {
  static Reference gpt2, llama;
  auto& r = std::string(m.name) == "gpt2" ? gpt2 : llama;
  if (!r.trained) {
    r.data = "--data text:" + testing::write_text(r.dir) + " ";
    testing::train_and_export(r.dir, r.data + m.flags, "one.safetensors", kSteps);
    r.trained = !::testing::Test::HasFatalFailure();
  }
  return r;
}

// Every layout, in one list: the resume sample draws from it.
struct Layout {
  const Strategy* s;
  const Pipeline* p;
  const Tensor* t;
  std::string name() const { return layout_name(*s, *p, *t); }
  std::string flags() const { return layout_flags(*s, *p, *t); }
};
std::vector<Layout> all_layouts() {
  std::vector<Layout> layouts;
  for (const auto& s : kStrategies) {
    for (const auto& p : kPipelines) {
      for (const auto& t : kTensors) layouts.push_back({&s, &p, &t});
    }
  }
  return layouts;
}

// The model a layout runs (the chessboard of the file's comment).
const char* model_of(int strategy, int pipeline, int tensor) {
  return (strategy + pipeline + tensor) % 2 == 0 ? "gpt2" : "llama";
}

class MatrixLayoutTest : public ::testing::TestWithParam<int> {};

// Every pipeline x tp cell of one model and data strategy; then the
// resume sample: one cell of them drawn at random writes a checkpoint at
// step 2 (a sharded one: every rank its pieces), which, alone in a
// folder, resumes to step 3 under another layout of the 54 drawn at random
// and must end where one process does too. The draws are seeded
// (TANDEM_MATRIX_SEED draws others); a failure names the pair.
TEST_P(MatrixLayoutTest, EveryLayoutIsOneProcessAndOneResumesUnderAnother) {
  const int strategy = GetParam();
  const auto& s = kStrategies[strategy];
  const auto layouts = all_layouts();
  const char* seed = std::getenv("TANDEM_MATRIX_SEED");
  std::mt19937 draw(static_cast<uint32_t>((seed ? std::atoi(seed) : 20261129) + 100 * strategy));
  const size_t sampled = draw() % 9;
  std::vector<std::pair<std::string, std::string>> runs[2], resumed[2];
  for (int pi = 0; pi < 3; ++pi) {
    for (int ti = 0; ti < 3; ++ti) {
      const auto& p = kPipelines[pi];
      const auto& t = kTensors[ti];
      const auto m = model(model_of(strategy, pi, ti));
      const int which = std::string(m.name) == "gpt2" ? 0 : 1;
      auto& ref = reference(m);
      ASSERT_TRUE(ref.trained);
      const Layout here{&s, &p, &t};
      const size_t index = static_cast<size_t>(3 * pi + ti);
      const bool sample = index == sampled;
      const std::string cell = std::string(m.name) + "-" + s.name + "-" + std::to_string(index);
      const std::string checkpoints = ref.dir.file(cell + "-ckpt");
      testing::train_and_export(ref.dir, ref.data + m.flags + " " + here.flags() +
                                (sample ? " --checkpoint-every 2 --checkpoint-dir " + checkpoints : ""),
                                cell + ".safetensors", kSteps);
      if (::testing::Test::HasFatalFailure()) return;
      runs[which].emplace_back(cell + ".safetensors", std::string(m.name) + " " + here.name());
      if (!sample) continue;
      const Layout& other = layouts[draw() % layouts.size()];
      const std::string folder = ref.dir.file(cell + "-resume");
      std::filesystem::create_directories(folder);
      for (const auto& entry : std::filesystem::directory_iterator(checkpoints)) {
        if (entry.path().filename().string().rfind("checkpoint-00000002", 0) == 0) {
          std::filesystem::copy(entry.path(), folder + "/" + entry.path().filename().string(),
                                std::filesystem::copy_options::recursive);
        }
      }
      const std::string what = std::string(m.name) + " " + here.name() + ", resumed at step 2 as " + other.name();
      const auto job = testing::train_in_threads("--max-steps " + std::to_string(kSteps.steps) + " --lr 0.05 " +
                                                 ref.data + m.flags + " " + other.flags() + " --progress lines "
                                                 "--resume --checkpoint-dir " + folder + " --export-weights " +
                                                 ref.dir.file(cell + "-resumed.safetensors"));
      ASSERT_TRUE(job.ok()) << what << "\n" << job.report();
      EXPECT_NE(job.log.find("resumed from " + folder + "/checkpoint-00000002"), std::string::npos)
          << what << "\n" << job.log;
      resumed[which].emplace_back(cell + "-resumed.safetensors", what);
    }
  }
  for (const char* name : {"gpt2", "llama"}) {
    const int which = std::string(name) == "gpt2" ? 0 : 1;
    const auto& ref = reference(model(name));
    testing::expect_close_weights(ref.dir, "one.safetensors", runs[which], kTolerance);
    testing::expect_close_weights(ref.dir, "one.safetensors", resumed[which], kTolerance);
  }
}

// The bound can fail: one setting changed, every layout would be that far.
TEST(MatrixLayoutTest, TheControlsFailTheBound) {
  for (const char* name : {"gpt2", "llama"}) {
    const auto m = model(name);
    auto& ref = reference(m);
    ASSERT_TRUE(ref.trained);
    testing::train_and_export(ref.dir, ref.data + m.flags + m.control, std::string(name) + "-control.safetensors",
                              kSteps);
    testing::expect_close_weights(ref.dir, "one.safetensors", {}, kTolerance,
                                  std::string(name) + "-control.safetensors");
  }
}

std::string test_name(const ::testing::TestParamInfo<MatrixLayoutTest::ParamType>& info) {
  return kStrategies[info.param].name;
}

INSTANTIATE_TEST_SUITE_P(EachStrategy, MatrixLayoutTest, ::testing::Range(0, 6), test_name);

}  // namespace matrix_layout
}  // namespace tandem
