// Every layout of today's dimensions, generated, against one process: for
// gpt2-tiny (tied embedding, AdamW, clipping) and llama-tiny (untied,
// grouped-query heads, SGD with label smoothing), each data strategy
// (DDP, seed 004's all-reduce, ZeRO-1, FSDP as ZeRO-3 and as ZeRO-2, HSDP
// over 2 x 2) times each pipeline (none, pp=2 with 1F1B, pp=2 interleaved
// over 2 virtual stages) times tp (1, 2, and 2 with sequence
// parallelism): 54 layouts a model, each trained 4 steps of 16 windows in
// float64 with its ranks as threads (up to 16), every weight within 1e-10
// of the one-process run (a control run with another setting fails it);
// and a sample of resumes: in each model and data strategy one layout's
// checkpoint at step 2, resumed under another drawn at random, ends there
// too. One test per model and data strategy, naming each layout (and the
// resumed pair) it checks.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace matrix_layout {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

constexpr testing::RunStyle kSteps{/*threads=*/true, /*steps=*/4};
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

class MatrixLayoutTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

// Every pipeline x tp cell of one model and data strategy; then the
// resume sample: one cell of them drawn at random writes a checkpoint at
// step 2 (a sharded one: every rank its pieces), which, alone in a
// folder, resumes to step 4 under another layout of the 54 drawn at random
// and must end where one process does too. The draws are seeded
// (TANDEM_MATRIX_SEED draws others); a failure names the pair.
TEST_P(MatrixLayoutTest, EveryLayoutIsOneProcessAndOneResumesUnderAnother) {
  const auto m = model(std::get<0>(GetParam()));
  const int strategy = std::get<1>(GetParam());
  const auto& s = kStrategies[strategy];
  auto& ref = reference(m);
  ASSERT_TRUE(ref.trained);
  const auto layouts = all_layouts();
  const char* seed = std::getenv("TANDEM_MATRIX_SEED");
  std::mt19937 draw(static_cast<uint32_t>((seed ? std::atoi(seed) : 20261129) + 100 * strategy + m.name[0]));
  const size_t sampled = draw() % 9;
  std::vector<std::pair<std::string, std::string>> runs, resumed;
  for (const auto& p : kPipelines) {
    for (const auto& t : kTensors) {
      const Layout here{&s, &p, &t};
      const bool sample = runs.size() == sampled;
      const std::string cell = std::string(m.name) + "-" + s.name + "-" + std::to_string(runs.size());
      const std::string checkpoints = ref.dir.file(cell + "-ckpt");
      testing::train_and_export(ref.dir, ref.data + m.flags + " " + here.flags() +
                                (sample ? " --checkpoint-every 2 --checkpoint-dir " + checkpoints : ""),
                                cell + ".safetensors", kSteps);
      if (::testing::Test::HasFatalFailure()) return;
      runs.emplace_back(cell + ".safetensors", std::string(m.name) + " " + here.name());
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
      resumed.emplace_back(cell + "-resumed.safetensors", what);
    }
  }
  testing::expect_close_weights(ref.dir, "one.safetensors", runs, kTolerance);
  testing::expect_close_weights(ref.dir, "one.safetensors", resumed, kTolerance);
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
  return std::get<0>(info.param) + "_" + kStrategies[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(EachModelAndStrategy, MatrixLayoutTest,
                         ::testing::Combine(::testing::Values("gpt2", "llama"), ::testing::Range(0, 6)), test_name);

}  // namespace matrix_layout
}  // namespace tandem
