// The planner's parts against what they model: the shapes against the
// registry and the built models, the bubble against the textbook's, the
// published runs' memory against the devices', and the device profiles'
// refusals. The traffic against tandem's own counts is PlanCliTest's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <set>
#include <tuple>
#include <string>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/models/registry.h"
#include "tandem/plan/calibrate.h"
#include "tandem/plan/planner.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::plan {
namespace {

using testing::TempDir;

// Every language model's parameters are the registry's count (which
// check_model_fits refuses by); the tiny ones', built, are the model's
// tensors one by one, and its tensors as many as DDP flags.
TEST(ModelShapeTest, ParametersAreTheRegistrysAndTheBuiltModels) {
  std::vector<std::string> names = models::Gpt2Config::preset_names();
  for (const auto& n : models::LlamaConfig::preset_names()) names.push_back(n);
  for (const auto& name : names) {
    const auto shape = model_shape(name, 256);
    models::ModelOptions o;
    o.vocab_size = 256;
    o.seq_len = 16;
    EXPECT_EQ(shape.parameters(), models::model_traits(name).parameter_count(o)) << name;
    if (name.find("tiny") == std::string::npos) continue;
    const auto model = models::make_model(name, o);
    int64_t numel = 0, tensors = 0;
    for (const auto& p : model->parameters()) {
      numel += p.numel();
      ++tensors;
    }
    EXPECT_EQ(shape.parameters(), numel) << name;
    EXPECT_EQ(shape.layers * shape.layer_tensors + shape.embedding_tensors + shape.norm_tensors + shape.head_tensors,
              tensors)
        << name;
  }
  EXPECT_THROW(model_shape("resnet18"), UsageError);
}

// An image classifier measured (Note [measured image models]): its layers
// as FSDP opens them up, its parameters and BatchNorm's statistics those
// of the built model, its FLOPs libtorch's count of the products (convnet
// at 1 x 28 x 28: conv1 2 x 1 x 32 x 9 x 28 x 28, conv2 2 x 32 x 64 x 9 x
// 14 x 14, fc1 2 x 3136 x 128, fc2 2 x 128 x 10, three times), and a
// bigger batch holding more.
TEST(ImageShapeTest, ConvnetIsItsBuiltModelAndItsProducts) {
  const auto shape = image_model_shape("convnet", 1, 28, 10, /*float64=*/false);
  ASSERT_TRUE(shape.image.has_value());
  const auto& s = *shape.image;
  models::ModelOptions o;
  o.in_channels = 1;
  o.image_size = 28;
  auto model = models::make_model("convnet", o);
  model->to(torch::kFloat32);  // as the trainer does: BatchNorm's step counts become float32 too
  EXPECT_EQ(shape.parameters(), models::count_parameters(*model));
  EXPECT_EQ(s.tensors, static_cast<int64_t>(model->parameters().size()));
  double buffers = 0;
  for (const auto& b : model->buffers()) buffers += double(b.nbytes());
  EXPECT_EQ(s.buffer_bytes, buffers);
  EXPECT_EQ(s.layer_names.size(), model->size());
  EXPECT_EQ(s.flops_per_sample, 3.0 * (2.0 * 32 * 9 * 784 + 2.0 * 32 * 64 * 9 * 196 + 2.0 * 3136 * 128 + 2.0 * 128 * 10));
  // A float32 image's activations: at least conv1's output kept (32 x 28 x 28).
  EXPECT_GT(s.activation_bytes_per_sample, 32.0 * 784 * 4);
  EXPECT_LT(s.activation_bytes_per_sample, 1e7);
  EXPECT_THROW(image_model_shape("gpt2-tiny", 1, 28, 10, false), UsageError);
  EXPECT_THROW(image_model_shape("convnet", 0, 28, 10, false), UsageError);
}

Job tiny_job(int64_t world) {
  Job job;
  job.model = model_shape("gpt2-tiny", 256);
  job.device = device_profile("h100");
  job.gpus_per_node = world;
  job.seq_len = 16;
  return job;
}

// llama-tiny in float32 on this machine's `cpu` profile, `world` ranks on
// one node, a global batch of `batch` sequences.
Job cpu_llama_job(int64_t world, int64_t batch) {
  auto job = tiny_job(world);
  job.model = model_shape("llama-tiny", 256);
  job.global_batch = batch;
  job.precision = Precision::kFloat32;
  job.device = device_profile("cpu");
  return job;
}

// The schedule replayed with stages of equal cost gives GPipe's and
// 1F1B's textbook bubble, (p - 1) / (m + p - 1), exactly.
TEST(PlannerTest, TheReplayedBubbleIsTheTextbooks) {
  for (const std::string schedule : {"gpipe", "1f1b"}) {
    for (int64_t p : {2, 4}) {
      for (int64_t m : {1, 2, 4, 8}) {
        auto job = tiny_job(p);
        job.global_batch = m;
        Layout l;
        l.pp = p;
        l.micro_batches = m;
        l.schedule = schedule;
        const auto c = layout_cost(job, l);
        EXPECT_NEAR(c.bubble, double(p - 1) / double(m + p - 1), 1e-12) << schedule << " p " << p << " m " << m;
        EXPECT_NEAR(c.bubble_seconds / c.step_seconds, c.bubble, 1e-12);
      }
    }
  }
}

// On a CPU whose ranks outnumber its cores (Note [ranks that take turns],
// [bubbles that other ranks fill]): pp=2,dp=2 with 4 micro-batches over 2
// cores leaves no idle core in the bubble (its step is all ranks' work
// over the cores, the bubble 0.2 of a step at a core a rank being less
// than the half the turns take); over 4 cores the bubble is idle, its
// replayed share of the step.
TEST(PlannerTest, RanksBeyondTheCoresFillTheBubble) {
  auto job = tiny_job(4);
  job.global_batch = 8;
  job.device = device_profile("cpu");
  Layout l;
  l.pp = 2;
  l.dp = 2;
  l.micro_batches = 4;
  l.schedule = "1f1b";
  // The calls' latency takes turns in part (PrefetchedCallsTakeNoTurns): none here.
  job.device.intra_node_latency = job.device.inter_node_latency = 0;
  job.device.cores = 2;
  const auto shared = layout_cost(job, l);
  EXPECT_NEAR(shared.bubble, 0.2, 1e-12);
  EXPECT_NEAR(shared.bubble_seconds, 0.0, 1e-15);
  EXPECT_NEAR(shared.step_seconds, shared.compute_seconds + shared.exposed_comm_seconds, 1e-15);
  job.device.cores = 4;
  const auto own = layout_cost(job, l);
  EXPECT_NEAR(own.bubble_seconds / own.step_seconds, 0.2, 1e-12);
  // Taking turns: the same work at half the cores costs twice the time.
  EXPECT_NEAR(shared.step_seconds, 2 * (own.compute_seconds + own.exposed_comm_seconds), 1e-12);
}

// Note [calibrated profile]: a calibration's steps on a line are fitted
// exactly; steps faster than the peak allows (resnet18's convolutions
// beat the timed 512 x 512 product here) get the peak's slope and the
// intercept that fits them at it, the residuals summing to 0 (a fit that
// kept the free line's intercept over-predicted every step, by 5-17%);
// an intercept below 0 gives the fit through the origin.
TEST(CalibrationFitTest, StepsFasterThanThePeakKeepTheirMean) {
  const double peak = 50e9;
  std::vector<std::pair<double, double>> steps;
  for (const double gflop : {1.0, 2.0, 4.0, 8.0}) steps.emplace_back(gflop * 1e9, 0.05 + 2.0 * gflop * 1e9 / peak);
  auto [slope, intercept] = fit_steps(steps, peak);
  EXPECT_NEAR(slope * peak, 2.0, 1e-9);
  EXPECT_NEAR(intercept, 0.05, 1e-12);
  for (auto& [x, y] : steps) y = 0.1 + 0.5 * x / peak;  // twice the peak: impossible
  std::tie(slope, intercept) = fit_steps(steps, peak);
  EXPECT_NEAR(slope * peak, 1.0, 1e-12);
  double residual = 0;
  for (const auto& [x, y] : steps) residual += y - (slope * x + intercept);
  EXPECT_NEAR(residual, 0.0, 1e-12);
  EXPECT_NEAR(intercept, 0.1 - 0.5 * 3.75e9 / peak, 1e-12);  // the mean of 1, 2, 4, 8 GFLOP: 3.75
  for (auto& [x, y] : steps) y = -0.01 + 2.0 * x / peak;
  std::tie(slope, intercept) = fit_steps(steps, peak);
  EXPECT_EQ(intercept, 0.0);
  EXPECT_GE(slope * peak, 1.0);
}

// Note [ranks that take turns], [prefetched calls that take turns]: over
// 2 cores 4 ranks' bytes cost twice what they do over 4 cores; the
// latency of DDP's calls, waited for at once, 1.5 times; FSDP's
// prefetched calls' latency the same. A call's overhead between
// computations is DDP's once a call and not FSDP's.
TEST(PlannerTest, PrefetchedCallsTakeNoTurns) {
  auto job = cpu_llama_job(4, 8);
  auto comm = [&job](DataSharding data, int64_t cores, double bandwidth, double latency, double overhead) {
    auto j = job;
    j.device.cores = cores;
    j.device.intra_node_bandwidth = j.device.inter_node_bandwidth = bandwidth;
    j.device.intra_node_latency = j.device.inter_node_latency = latency;
    j.device.call_overhead = overhead;
    Layout l;
    l.dp = 4;
    l.micro_batch = 2;
    l.data = data;
    return layout_cost(j, l).exposed_comm_seconds;
  };
  for (const auto data : {DataSharding::kFsdp, DataSharding::kDdp}) {
    const bool fsdp = data == DataSharding::kFsdp;
    EXPECT_NEAR(comm(data, 2, 1e9, 0, 0) / comm(data, 4, 1e9, 0, 0), 2.0, 1e-12);
    EXPECT_NEAR(comm(data, 2, 1e30, 1e-3, 0) / comm(data, 4, 1e30, 1e-3, 0), fsdp ? 1.0 : 1.5, 1e-12);
    EXPECT_GT(comm(data, 4, 1e30, 1e-3, 0), 0.0);
    // DDP's calls: llama-tiny's 3.2 MB of gradients in one bucket, and the
    // last (Note [planned traffic]).
    const double overhead = comm(data, 2, 1e30, 0, 1e-3);
    EXPECT_NEAR(overhead, fsdp ? 0.0 : 2e-3, 1e-12);
  }
}

// Note [replicated element-wise work]: a tp rank runs its layers' norms
// and residual adds on all of its micro-batch's tokens, at the profile's
// timing for that many elements; under sequence parallelism on its part
// of them; a dp rank on its own micro-batch. Control: the same layouts
// without timings plan none of it.
TEST(PlannerTest, TensorParallelRanksRunTheNormsWhole) {
  auto job = cpu_llama_job(2, 4);
  job.device.cores = 2;
  job.device.norm_timings = {{512, 1e-3, 1e-4}, {1024, 3e-3, 2e-4}, {2048, 4e-3, 3e-4}};
  auto without = job;
  without.device.norm_timings.clear();
  const double d = double(job.model.hidden), tokens = double(job.global_batch * job.seq_len);
  const double layers = double(job.model.layers);
  auto extra = [&](const Layout& l) { return layout_cost(job, l).compute_seconds - layout_cost(without, l).compute_seconds; };
  Layout tp;
  tp.tp = 2;
  tp.micro_batch = 4;
  EXPECT_NEAR(extra(tp), layers * job.device.norm_seconds(true, tokens * d), 1e-12);
  EXPECT_GT(extra(tp), 0.0);
  tp.sequence_parallel = true;
  EXPECT_NEAR(extra(tp), layers * job.device.norm_seconds(true, tokens * d / 2), 1e-12);
  Layout dp;
  dp.dp = 2;
  dp.micro_batch = 2;
  EXPECT_NEAR(extra(dp), layers * job.device.norm_seconds(true, tokens * d / 2), 1e-12);
  // The timings interpolated between sizes, the first below them, the last
  // two's slope above; LayerNorm's apart.
  EXPECT_DOUBLE_EQ(job.device.norm_seconds(true, 768), 2e-3);
  EXPECT_DOUBLE_EQ(job.device.norm_seconds(true, 100), 1e-3);
  EXPECT_DOUBLE_EQ(job.device.norm_seconds(true, 4096), 6e-3);
  EXPECT_DOUBLE_EQ(job.device.norm_seconds(false, 1024), 2e-4);
  EXPECT_EQ(without.device.norm_seconds(true, 1024), 0.0);
}

// Context parallelism is laid out where 2 cp divides the sequence; a cp
// rank keeps the activations of its cp-th of each sequence, and its ring
// sends 6 (C - 1) + 2 blocks a layer (8 more per C - 1 when recomputed).
TEST(PlannerTest, ContextParallelLayoutsCutTheSequence) {
  for (int64_t seq : {16, 12}) {
    auto job = tiny_job(4);
    job.seq_len = seq;
    job.global_batch = 4;
    std::set<int64_t> cps;
    for (const auto& c : plan_layouts(job)) cps.insert(c.layout.cp);
    EXPECT_EQ(cps, (seq == 16 ? std::set<int64_t>{1, 2, 4} : std::set<int64_t>{1, 2})) << seq;
  }
  auto job = tiny_job(4);
  job.global_batch = 4;
  Layout whole, cut;
  whole.dp = 4;
  cut.dp = 1;
  cut.cp = 4;
  cut.micro_batch = whole.micro_batch = 1;
  cut.micro_batches = 4;
  const auto a = layout_cost(job, whole), b = layout_cost(job, cut);
  EXPECT_NEAR(b.memory.activations * 4, a.memory.activations, 1e-6 * a.memory.activations);
  const auto& m = job.model;
  const double block = double(16 / 4) * double(m.kv_heads) * double(m.head_dim) * 2;  // bf16
  EXPECT_EQ(b.bytes.at("cp").at("send"), 4.0 * double(m.layers) * (6.0 * 3 + 2) * block);
  EXPECT_EQ(b.bytes.count("dp"), 0u);
  EXPECT_GT(b.bytes.at("dp_cp").at("all_reduce"), 0);  // the gradients over the 4 ranks of one sample
  cut.recompute = true;
  EXPECT_EQ(layout_cost(job, cut).bytes.at("cp").at("send"), 4.0 * double(m.layers) * (8.0 * 3 + 2) * block);
}

// At scale, on paper: Llama 3 8B with FSDP on 8 H100s at 8192 tokens and
// 2 sequences a rank (torchtitan's published run) fits, as does GPT-3
// 175B at tp=8, pp=8 on A100s with every layer recomputed (Megatron-LM's
// 2021 layout); the same 175B replicated whole on 64 ranks does not.
TEST(PlannerTest, ThePublishedLayoutsFitAndAReplicated175BDoesNot) {
  Job llama;
  llama.model = model_shape("llama-3-8b");
  llama.device = device_profile("h100");
  llama.seq_len = 8192;
  llama.global_batch = 16;
  PlanOptions dp8;
  dp8.mesh = "dp=8";
  bool fsdp_fits = false;
  for (const auto& c : plan_layouts(llama, dp8)) fsdp_fits |= c.fits && c.layout.data == DataSharding::kFsdp;
  EXPECT_TRUE(fsdp_fits);

  Job gpt3;
  gpt3.model = model_shape("gpt3-175b");
  gpt3.device = device_profile("a100");
  gpt3.nodes = 8;
  gpt3.seq_len = 2048;
  gpt3.global_batch = 64;
  Layout megatron;
  megatron.pp = 8;
  megatron.tp = 8;
  megatron.sequence_parallel = false;
  megatron.recompute = true;
  megatron.micro_batches = 64;
  const auto c = layout_cost(gpt3, megatron);
  EXPECT_TRUE(c.fits) << c.memory.total() / (1 << 30) << " GiB";
  Layout whole;
  whole.dp = 64;
  whole.recompute = true;
  const auto w = layout_cost(gpt3, whole);
  EXPECT_FALSE(w.fits);
  EXPECT_GT(w.shortfall, 1e12);  // 175e9 parameters at 16 bytes each
}

std::string write(const TempDir& dir, const std::string& text) {
  const auto path = dir.file("profile.json");
  std::ofstream(path) << text;
  return path;
}

const char* kProfile = R"({"name": "x", "peak_tflops_bf16": 989, "peak_tflops_fp32": 67, "memory_gib": 80,
  "intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
  "inter_node_latency_us": 25, "efficiency": 0.45})";

TEST(DeviceProfileTest, AFileIsReadAndItsMistakesAreNamed) {
  TempDir dir;
  const auto p = device_profile(write(dir, kProfile));
  EXPECT_EQ(p.name, "x");
  EXPECT_DOUBLE_EQ(p.inter_node_bandwidth, 50e9);
  EXPECT_DOUBLE_EQ(p.memory_bytes, 80.0 * (1 << 30));
  auto refused = [&](const std::string& text) {
    return testing::error_of([&] { device_profile(write(dir, text)); });
  };
  std::string bad = kProfile;
  EXPECT_NE(refused(std::string(bad).replace(bad.find(": 50,"), 5, ": -5,")).find("\"inter_node_gb_per_s\" must be positive"),
            std::string::npos);
  EXPECT_NE(refused(std::string(bad).replace(bad.find("0.45"), 4, "1.5")).find("\"efficiency\" must be positive, from 1e-06 to 1, got 1.5"),
            std::string::npos);
  EXPECT_NE(refused(std::string(bad).replace(bad.find("\"name\""), 6, "\"nme\"")).find("unknown field \"nme\""),
            std::string::npos);
  EXPECT_NE(refused("{\"name\": \"x\"}").find("has no \"peak_tflops_bf16\""), std::string::npos);
  EXPECT_NE(refused("[1, 2").find("not a JSON profile"), std::string::npos);
  EXPECT_NE(refused(std::string(bad).replace(0, 1, "{\"efficiency\": 0.5, ")).find("the field \"efficiency\" is given twice"),
            std::string::npos);
  EXPECT_NE(refused(std::string(bad).replace(bad.find("\"x\""), 3, "\"a\\u001bb\"")).find("must be a printable name"),
            std::string::npos);
  const auto timed = device_profile(write(dir, std::string(bad).replace(bad.size() - 1, 1,
                                                                        ", \"norm_seconds\": [[64, 0.5, 0.25], [128, 1, 0.5]]}")));
  ASSERT_EQ(timed.norm_timings.size(), 2u);
  EXPECT_DOUBLE_EQ(timed.norm_seconds(true, 96), 0.75);
  for (const std::string wrong : {"[[64, 0.5]]", "[[64, 0.5, 0.25], [32, 1, 0.5]]", "[[64, -1, 0.25]]", "3"}) {
    EXPECT_NE(refused(std::string(bad).replace(bad.size() - 1, 1, ", \"norm_seconds\": " + wrong + "}"))
                  .find("\"norm_seconds\" must be a list of [elements, seconds with RMSNorm, seconds with LayerNorm]"),
              std::string::npos)
        << wrong;
  }
  const auto overhead = device_profile(write(dir, std::string(bad).replace(bad.size() - 1, 1,
                                                                           ", \"call_overhead_us\": 150}")));
  EXPECT_DOUBLE_EQ(overhead.call_overhead, 150e-6);
  EXPECT_EQ(p.call_overhead, 0.0);
  EXPECT_NE(refused(std::string(bad).replace(bad.size() - 1, 1, ", \"call_overhead_us\": -1}"))
                .find("\"call_overhead_us\" must be a number from 0 to 1e9, got -1"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { device_profile("tpu-v9"); }).find("unknown device (presets: h100, h200, a100, cpu"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::plan
