// tandem plan against what tandem train does (Note [planned traffic]): for
// each layout of a grid, the bytes a step the planner predicts over each
// mesh dimension are those the run's process groups count (--metrics-out's
// comm_bytes_per_step, rank 0's: the first stage's), exactly, the runs'
// ranks as threads where only bytes are compared (train_threads.h) and as
// processes where memory is (the counting allocator is the process's);
// and its refusals.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include "same_weights.h"
#include "testing.h"
#include "train_threads.h"

namespace tandem {
namespace plan_cli {  // the file's own names (a layer's tests compile as one unit)

using testing::TempDir;

struct Case {
  std::string model, ranks, flags;  // tandem train's
  std::string strategy;      // the planner's layout: its strategy, sp, micro-batches
  bool sequence_parallel;
  int64_t micro_batches;
};

TEST(PlanCliTest, PredictedBytesPerStepAreTheCountedOnes) {
  TempDir dir;
  const std::string data = " --data text:" + testing::write_text(dir) + " --seq-len 16 --batch-size 8";
  const std::vector<Case> cases = {
      {"llama-tiny", "2", "--mesh dp=2", "ddp", false, 1},
      {"llama-tiny", "2", "--mesh dp=2 --shard-optimizer", "zero1", false, 1},
      {"llama-tiny", "2", "--mesh dp=2 --strategy fsdp", "fsdp", false, 1},
      {"llama-tiny", "2", "--mesh tp=2", "ddp", false, 1},
      {"llama-tiny", "2", "--mesh tp=2 --sequence-parallel", "ddp", true, 1},
      {"llama-tiny", "2", "--mesh pp=2 --micro-batches 2", "ddp", false, 2},
      {"llama-tiny", "4", "--mesh pp=2,dp=2", "ddp", false, 4},
      {"llama-tiny", "4", "--mesh dp=2,tp=2", "ddp", false, 1},
      {"llama-tiny", "4", "--mesh pp=2,tp=2 --micro-batches 2", "ddp", false, 2},
      // A tied embedding's FSDP unit gathered once; a router's partial gradients over tp.
      {"gpt2-tiny", "2", "--mesh dp=2 --strategy fsdp", "fsdp", false, 1},
      {"mixtral-tiny", "2", "--mesh tp=2", "ddp", false, 1},
      {"qwen3-moe-tiny", "4", "--mesh pp=2,tp=2 --micro-batches 2", "ddp", false, 2},
      // cp's ring (GPT-2's heads, LLaMA's grouped ones) beside dp, FSDP, tp with sp, and pp.
      {"gpt2-tiny", "4", "--mesh dp=2,cp=2", "ddp", false, 1},
      {"llama-tiny", "4", "--mesh cp=2,tp=2 --sequence-parallel", "ddp", true, 1},
      {"llama-tiny", "4", "--mesh pp=2,cp=2 --micro-batches 2", "ddp", false, 2},
      {"llama-tiny", "4", "--mesh cp=4 --strategy fsdp", "fsdp", false, 1},
  };
  for (const auto& c : cases) {
    const std::string mesh = c.flags.substr(7, c.flags.find(' ', 7) - 7);
    const auto metrics = dir.file("m.jsonl");
    const auto run = testing::train_in_threads("--model " + c.model + data + " --max-steps 2 --epochs 1 "
                                               "--progress off --nproc-per-node " + c.ranks + " " + c.flags +
                                               " --metrics-out " + metrics);
    ASSERT_TRUE(run.ok()) << run.report();
    const auto counted = testing::last_metrics(metrics)["comm_bytes_per_step"];
    std::remove(metrics.c_str());
    auto plan = testing::run_tandem("plan --model " + c.model + " --vocab-size 256 --seq-len 16 --batch-size 8 "
                                    "--precision float32 --device h100 --gpus-per-node " + c.ranks + " --mesh " +
                                    mesh + " --json");
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const auto layouts = nlohmann::json::parse(plan.output)["layouts"];
    bool found = false;
    for (const auto& l : layouts) {
      if (l["strategy"] != c.strategy || l["sequence_parallel"] != c.sequence_parallel ||
          l["activation_checkpointing"] || l["micro_batches"] != c.micro_batches) {
        continue;
      }
      found = true;
      const auto& predicted = l["bytes_per_step_by_stage"][0];
      EXPECT_EQ(predicted, counted) << c.model << " " << c.flags << "\npredicted " << predicted.dump() << "\ncounted " << counted.dump();
      std::printf("%-15s %-36s %s\n", c.model.c_str(), c.flags.c_str(), counted.dump().c_str());
    }
    EXPECT_TRUE(found) << c.flags << ": no such layout planned";
  }
}

// Expert parallelism: DDP's all-reduce with the experts kept out and
// ep_replicate's sum of the experts' gradients are the counted bytes
// exactly; the all-to-alls depend on the routing, and a uniform routing's
// figure is within 10% of the run's (0.92-0.94 here).
TEST(PlanCliTest, ExpertLayoutsAreTheCountedBytes) {
  TempDir dir;
  const std::string data = " --data text:" + testing::write_text(dir) + " --seq-len 16 --batch-size 8";
  for (const auto& [ranks, mesh] : std::vector<std::pair<std::string, std::string>>{{"2", "dp=2,ep=2"},
                                                                                   {"4", "dp=4,ep=2"}}) {
    const auto metrics = dir.file("m.jsonl");
    auto run = testing::run_tandem("train --model mixtral-tiny" + data + " --max-steps 2 --epochs 1 --progress off "
                                   "--nproc-per-node " + ranks + " --mesh " + mesh + " --metrics-out " + metrics);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto counted = testing::last_metrics(metrics)["comm_bytes_per_step"];
    std::remove(metrics.c_str());
    auto plan = testing::run_tandem("plan --model mixtral-tiny --vocab-size 256 --seq-len 16 --batch-size 8 "
                                    "--precision float32 --device h100 --gpus-per-node " + ranks + " --mesh " + mesh +
                                    " --json");
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    bool found = false;
    const auto layouts = nlohmann::json::parse(plan.output)["layouts"];
    for (const auto& l : layouts) {
      if (l["activation_checkpointing"] || l["micro_batches"] != 1) continue;
      found = true;
      auto predicted = l["bytes_per_step_by_stage"][0];
      const double all_to_all = predicted["ep"]["all_to_all"].get<double>();
      const double ratio = counted["ep"]["all_to_all"].get<double>() / all_to_all;
      EXPECT_GT(ratio, 0.9) << mesh;
      EXPECT_LT(ratio, 1.1) << mesh;
      predicted["ep"]["all_to_all"] = counted["ep"]["all_to_all"];
      EXPECT_EQ(predicted, counted) << mesh << "\npredicted " << predicted.dump() << "\ncounted " << counted.dump();
      std::printf("%-10s %s (the all-to-alls %.3f of the uniform routing's)\n", mesh.c_str(), counted.dump().c_str(),
                  ratio);
    }
    EXPECT_TRUE(found) << mesh;
  }
}

// The predicted peak memory of rank 0 is what tandem train --count-memory
// measures, within 10%, for data, tensor and pipeline parallelism (DDP's
// buckets holding the gradients, FSDP's shards and gathered units,
// sequence parallelism's cut norms, a pipeline stage's held messages; on
// CPUs GPT-2's transposed weights kept for backward), the run's optimizer
// the plan's (SGD with momentum: one state a parameter).
TEST(PlanCliTest, PredictedMemoryIsTheMeasuredPeakWithinTenPercent) {
  TempDir dir;
  const std::string data = " --data text:" + testing::write_text(dir) + " --seq-len 64 --batch-size 16";
  const std::vector<std::tuple<std::string, std::string, std::string, bool, int64_t>> cases = {
      {"llama-tiny", "--mesh dp=2", "ddp", false, 1},
      {"llama-tiny", "--mesh dp=2 --strategy fsdp", "fsdp", false, 1},
      {"llama-tiny", "--mesh tp=2 --sequence-parallel", "ddp", true, 1},
      {"llama-tiny", "--mesh pp=2 --micro-batches 8", "ddp", false, 8},
      {"gpt2-tiny", "--mesh dp=2", "ddp", false, 1},
      {"gpt2-tiny", "--mesh tp=2", "ddp", false, 1},
  };
  for (const auto& [model, flags, strategy, sp, micro_batches] : cases) {
    const auto metrics = dir.file("m.jsonl");
    auto run = testing::run_tandem("train --model " + model + data + " --max-steps 3 --epochs 1 --progress off "
                                   "--optimizer sgd --nproc-per-node 2 --count-memory " + flags + " --metrics-out " +
                                   metrics);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const double measured = testing::last_metrics(metrics)["peak_memory_bytes"].get<double>();
    std::remove(metrics.c_str());
    const std::string mesh = flags.substr(7, flags.find(' ', 7) - 7);
    auto plan = testing::run_tandem("plan --model " + model + " --vocab-size 256 --seq-len 64 --batch-size 16 "
                                    "--precision float32 --optimizer sgd --device cpu --gpus-per-node 2 --mesh " +
                                    mesh + " --json");
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const auto planned = nlohmann::json::parse(plan.output);
    int found = 0;
    for (const auto& l : planned["layouts"]) {
      if (l["strategy"] != strategy || l["sequence_parallel"] != sp || l["activation_checkpointing"] ||
          l["micro_batches"] != micro_batches) {
        continue;
      }
      ++found;
      const double predicted = l["memory_bytes_by_stage"][0].get<double>();
      std::printf("%-11s %-32s measured %.2f MB, predicted %.2f MB (%.3f)\n", model.c_str(), flags.c_str(),
                  measured / 1e6, predicted / 1e6, predicted / measured);
      EXPECT_NEAR(predicted / measured, 1.0, 0.10) << model << " " << flags;
    }
    EXPECT_EQ(found, 1) << model << " " << flags << ": the layout planned once";
  }
}

// An image classifier (Note [measured image models]): for resnet18 under
// DDP and HSDP and convnet under FSDP on a small CIFAR-10, the planned
// bytes a step are the counted ones, exactly (BatchNorm's statistics
// broadcast once a step, FSDP's shards padded to whole rows, HSDP's two
// splits), and rank 0's planned peak is within 10% of the measured one
// (the data set, 3 MB here, counted in the measured peak only).
TEST(PlanCliTest, ImageLayoutsAreTheCountedBytesAndPeak) {
  TempDir dir;
  testing::write_synthetic_cifar(dir.path(), 128, 64);
  const std::string data = " --data cifar10:" + dir.path() + " --batch-size 64";
  struct ImageCase {
    std::string model, ranks, flags, plan_flags, strategy;
  };
  for (const auto& c : std::vector<ImageCase>{
           {"resnet18", "2", "--mesh dp=2", "--gpus-per-node 2", "ddp"},
           {"resnet18", "4", "--mesh dp_replicate=2,dp_shard=2 --strategy fsdp", "--nodes 2 --gpus-per-node 2",
            "hsdp"},
           {"convnet", "2", "--mesh dp=2 --strategy fsdp", "--gpus-per-node 2", "fsdp"}}) {
    const auto metrics = dir.file("m.jsonl");
    auto run = testing::run_tandem("train --model " + c.model + data + " --max-steps 3 --epochs 1 --progress off "
                                   "--count-memory --nproc-per-node " + c.ranks + " " + c.flags + " --metrics-out " +
                                   metrics);
    ASSERT_EQ(run.exit_code, 0) << run.output;
    const auto last = testing::last_metrics(metrics);
    std::remove(metrics.c_str());
    auto plan = testing::run_tandem("plan --model " + c.model + " --channels 3 --image-size 32 --classes 10 "
                                    "--batch-size 64 --precision float32 --optimizer sgd --device cpu " + c.plan_flags +
                                    " --json");
    ASSERT_EQ(plan.exit_code, 0) << plan.output;
    const auto layouts = nlohmann::json::parse(plan.output)["layouts"];
    int found = 0;
    for (const auto& l : layouts) {
      if (l["strategy"] != c.strategy || l["micro_batches"] != 1) continue;
      ++found;
      EXPECT_EQ(l["bytes_per_step_by_stage"][0], last["comm_bytes_per_step"]) << c.model << " " << c.flags;
      const double measured = last["peak_memory_bytes"].get<double>();
      const double predicted = l["memory_bytes_by_stage"][0].get<double>();
      std::printf("%-9s %-50s measured %.2f MB, predicted %.2f MB (%.3f)\n", c.model.c_str(), c.flags.c_str(),
                  measured / 1e6, predicted / 1e6, predicted / measured);
      EXPECT_NEAR(predicted / measured, 1.0, 0.10) << c.model << " " << c.flags;
    }
    EXPECT_EQ(found, 1) << c.model << " " << c.flags;
  }
}

// tandem train --mesh auto: the planner picks a layout before the workers
// start, says so, trains it, and after the run sets its prediction beside
// what was measured (the bytes a step exactly so), a language model's and
// an image classifier's. The flags the user gave stay: --strategy fsdp
// keeps the choice among FSDP's layouts.
TEST(PlanCliTest, MeshAutoPicksPrintsAndTrainsALayout) {
  TempDir dir;
  const std::string job = "train --model llama-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --batch-size 8 --max-steps 2 --epochs 1 --progress off --nproc-per-node 4 "
                          "--mesh auto";
  auto r = testing::run_tandem(job);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tandem: --mesh auto: --mesh "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layouts planned for 4 ranks on cpu that fit"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] --mesh auto chose "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tokens/s, measured "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(equal)"), std::string::npos) << r.output;
  r = testing::run_tandem(job + " --strategy fsdp");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto chosen = r.output.find("tandem: --mesh auto: --mesh ");
  ASSERT_NE(chosen, std::string::npos) << r.output;
  const std::string line = r.output.substr(chosen, r.output.find('\n', chosen) - chosen);
  EXPECT_NE(line.find(" --strategy fsdp "), std::string::npos) << line;
  EXPECT_NE(line.find("(the fastest of "), std::string::npos) << line;
  EXPECT_NE(r.output.find("(fsdp): predicted"), std::string::npos) << r.output;
  // An image classifier, measured before its workers start: its images/s
  // and bytes a step beside the measured.
  testing::write_synthetic_cifar(dir.file("cifar"), 64, 16);
  r = testing::run_tandem("train --model convnet --data cifar10:" + dir.file("cifar") + " --batch-size 16 "
                          "--max-steps 2 --epochs 1 --progress off --nproc-per-node 2 --mesh auto");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tandem: --mesh auto: --mesh dp=2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" images/s, a step of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" images/s, measured "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(equal)"), std::string::npos) << r.output;
  EXPECT_TRUE(testing::tandem_fails("train --model llama-tiny --data text:" + dir.file("text.txt") +
                                        " --seq-len 16 --max-steps 1 --mesh auto",
                                    2, "--mesh auto is chosen by tandem train's own launcher"));
  // Under another launcher (torchrun itself: TorchrunCliTest.MeshAutoIsRefusedAtOnce).
}

// Bad input: exit 2 and a message naming it.
TEST(PlanCliTest, BadInputIsNamed) {
  TempDir dir;
  const std::string bad = dir.file("p.json");
  std::ofstream(bad) << R"({"name": "x", "peak_tflops_bf16": 989, "peak_tflops_fp32": 67, "memory_gib": 80,
    "intra_node_gb_per_s": -450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
    "inter_node_latency_us": 25, "efficiency": 0.45})";
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device tpu-v9", 2,
                                    "--device tpu-v9: unknown device (presets: h100, h200, a100, cpu"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device " + bad, 2,
                                    "\"intra_node_gb_per_s\" must be positive, from 1e-06 to 1e+06, got -450"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3.1-405b --gpus-per-node 1 --device h100", 2,
                                    "no layout of llama-3.1-405b fits 1 x h100: the closest"));
  EXPECT_TRUE(testing::tandem_fails("plan --model resnet19", 2, "--model resnet19: tandem plan plans the language"));
  EXPECT_TRUE(testing::tandem_fails("plan --model resnet18 --seq-len 64", 2, "--seq-len: resnet18 is an image "
                                    "classifier (its batch is --batch-size images"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --image-size 32", 2,
                                    "--image-size: llama-tiny is a language model"));
  EXPECT_TRUE(testing::tandem_fails("plan --model resnet18 --image-size 2000", 2,
                                    "--image-size 2000: expected 1 to 1024 pixels"));
  EXPECT_TRUE(testing::tandem_fails("plan --model convnet --image-size 2", 2,
                                    "--model convnet for images of 3 x 2 x 2 (--channels, --image-size): the planner "
                                    "builds and runs it to measure it, and it failed: convnet: image size must be"));
  EXPECT_TRUE(testing::tandem_fails("plan --model mlp --channels 64 --image-size 1024", 2,
                                    "the planner lets one take while it measures"));
  EXPECT_TRUE(testing::tandem_fails("plan --model convnet --gpus-per-node 3 --batch-size 8", 2,
                                    "an image classifier is planned over dp ranks only, dividing the global batch of 8"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --mesh dp=2,ep=2 --gpus-per-node 2", 2,
                                    "no layout of llama-3-8b on 2 rank(s) with --mesh dp=2,ep=2"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --seq-len 6 --mesh cp=2 --gpus-per-node 2", 2,
                                    "2 cp dividing the sequence of 6 tokens"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --seq-len 100 --global-batch-tokens 150", 2,
                                    "--global-batch-tokens 150: not a whole number of sequences of 100"));
  // Sizes whose products would overflow or whose enumeration would not end.
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --nodes 2305843009213693953 --gpus-per-node 8", 2,
                                    "the planner lays out at most 1048576 ranks"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --batch-size 100000000", 2,
                                    "--batch-size 100000000: at most 16777216 sequences"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --vocab-size 72057594037927937", 2,
                                    "expected a vocabulary of at most 2^31 tokens"));
  std::ofstream(bad) << R"({"name": "x", "peak_tflops_bf16": 1e-200, "peak_tflops_fp32": 67, "memory_gib": 80,
    "intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
    "inter_node_latency_us": 25, "efficiency": 0.45})";
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device " + bad, 2,
                                    "\"peak_tflops_bf16\" must be positive, from 1e-06 to 1e+06"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device " + dir.path(), 2, "not a regular file"));
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-tiny --gpus-per-node 8 --mesh tp=8", 2,
                                    "the planner's layouts have tp dividing a node's ranks (8) and the model's 4 "
                                    "heads"));
  std::ofstream(bad) << R"({"name": "x", "peak_tflops_bf16": 989, "peak_tflops_fp32": 67, "memory_gib": 80,
    "intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
    "inter_node_latency_us": 25, "efficiency": 0.45, "layer_overhead_us": -3})";
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device " + bad, 2,
                                    "\"layer_overhead_us\" must be a number from 0 to 1e9, got -3"));
  std::ofstream(bad) << R"({"name": "x", "peak_tflops_bf16": 989, "peak_tflops_fp32": 67, "memory_gib": 80,
    "intra_node_gb_per_s": 450, "inter_node_gb_per_s": 50, "intra_node_latency_us": 10,
    "inter_node_latency_us": 25, "efficiency": 0.45, "cores": 2.5})";
  EXPECT_TRUE(testing::tandem_fails("plan --model llama-3-8b --device " + bad, 2,
                                    "\"cores\" must be a whole number from 1 to 2^20, got 2.5"));
  EXPECT_TRUE(testing::tandem_fails("plan --calibrate " + dir.file("c.json") + " --nodes 2", 2,
                                    "--nodes plans a job: --calibrate measures this machine"));
}

// tandem plan --calibrate writes a profile tandem plan reads back, the
// fit's figures in range; and a layer's overhead in a profile makes the
// plan's step of many micro-batches slower than of few (Note [calibrated
// profile]), from a written profile: the fit itself moves with the
// machine's load (three tests at once here fitted an overhead of 0).
// Control: the same profile without the overhead.
TEST(PlanCliTest, CalibrateWritesAProfileThePlannerReads) {
  TempDir dir;
  auto r = run_tandem("plan --calibrate " + dir.file("cpu.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto profile = nlohmann::json::parse(testing::read_text(dir.file("cpu.json")));
  EXPECT_GT(profile["efficiency"].get<double>(), 0.05) << profile.dump();
  EXPECT_LE(profile["efficiency"].get<double>(), 1.0);
  EXPECT_GE(profile["layer_overhead_us"].get<double>(), 0.0);
  EXPECT_GT(profile["intra_node_gb_per_s"].get<double>(), 0.01);
  EXPECT_GE(profile["call_overhead_us"].get<double>(), 0.0);
  EXPECT_GE(profile["cores"].get<int64_t>(), 1);
  // A layer's norms timed at each size the steps were (64 to 1024 tokens of
  // llama-tiny's 128), RMSNorm's and LayerNorm's.
  ASSERT_EQ(profile["norm_seconds"].size(), 5u) << profile.dump();
  EXPECT_EQ(profile["norm_seconds"][0][0].get<double>(), 64.0 * 128);
  EXPECT_EQ(profile["norm_seconds"][4][0].get<double>(), 1024.0 * 128);
  for (const auto& row : profile["norm_seconds"]) {
    EXPECT_GT(row[1].get<double>(), 0.0);
    EXPECT_GT(row[2].get<double>(), 0.0);
  }
  r = run_tandem("plan --model llama-tiny --vocab-size 256 --seq-len 64 --batch-size 16 --precision float32 "
                 "--gpus-per-node 2 --mesh pp=2 --json --device " + dir.file("cpu.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto compute = [&](double overhead_us, int64_t micro_batches) {
    std::ofstream(dir.file("written.json")) << R"({"name": "cpu", "peak_tflops_bf16": 0.2, "peak_tflops_fp32": 0.2,
      "memory_gib": 8, "intra_node_gb_per_s": 2, "inter_node_gb_per_s": 1, "intra_node_latency_us": 50,
      "inter_node_latency_us": 100, "efficiency": 0.5, "cores": 2, "layer_overhead_us": )" << overhead_us << "}";
    auto plan = run_tandem("plan --model llama-tiny --vocab-size 256 --seq-len 64 --batch-size 16 --precision "
                           "float32 --gpus-per-node 2 --mesh pp=2 --json --device " + dir.file("written.json"));
    EXPECT_EQ(plan.exit_code, 0) << plan.output;
    const auto parsed = nlohmann::json::parse(plan.output.substr(plan.output.find('{')));
    for (const auto& l : parsed["layouts"]) {
      if (!l["activation_checkpointing"].get<bool>() && l["micro_batches"] == micro_batches) {
        return l["compute_seconds"].get<double>();
      }
    }
    ADD_FAILURE() << "no layout of " << micro_batches << " micro-batches";
    return 0.0;
  };
  EXPECT_GT(compute(500, 16), compute(500, 2) * 1.5)
      << "16 micro-batches pay their layers' overhead 8 times as often as 2";
  EXPECT_LT(compute(0, 16), compute(0, 2) * 1.5) << "control: without an overhead they cost about the same";
  // An image classifier calibrates on its own steps, its FLOPs measured.
  r = run_tandem("plan --calibrate " + dir.file("convnet.json") + " --model convnet --image-size 16");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("convnet, 16 images of 3 x 16 x 16 a step"), std::string::npos) << r.output;
  r = run_tandem("plan --model convnet --image-size 16 --batch-size 16 --precision float32 --gpus-per-node 2 "
                 "--json --device " + dir.file("convnet.json"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(testing::tandem_fails("plan --calibrate " + dir.file("x.json") + " --model convnet --seq-len 64", 2,
                                    "--seq-len: convnet is an image classifier"));
}

}  // namespace plan_cli
}  // namespace tandem
