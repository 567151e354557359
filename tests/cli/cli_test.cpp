// End-to-end: the real `tandem` binary, as a user runs it.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/safetensors.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

int count_lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

TEST(CliTest, HelpListsEveryTrainFlagWithDefaults) {
  for (const std::string args : {"--help", "train --help"}) {
    auto r = run_tandem(args);
    EXPECT_EQ(r.exit_code, 0) << args;
    for (const char* flag : {"--data SPEC", "--val-data", "--model NAME", "--epochs N", "--batch-size N",
                             "--lr X", "--momentum X", "--weight-decay X", "--workers N", "--device DEV",
                             "--seed N", "--max-steps N", "--checkpoint-dir DIR", "--resume",
                             "--metrics-out FILE", "--export-weights FILE", "--shard-optimizer",
                             "--profile-out FILE", "--profile-steps A:B"}) {
      EXPECT_NE(r.output.find(flag), std::string::npos) << args << " lacks " << flag;
    }
    EXPECT_NE(r.output.find("(default: fashion-mnist)"), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("(default: 256)"), std::string::npos) << r.output;
  }
}

TEST(CliTest, UsageMistakesAreOneLineAndExitTwo) {
  auto r = run_tandem("train --bogus 1");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "tandem: error: unknown flag --bogus (see tandem train --help)\n");
  r = run_tandem("train --epochs -3");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.output, "tandem: error: --epochs: expected a positive integer, got '-3'\n");
  r = run_tandem("frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(count_lines(r.output), 1) << r.output;
  r = run_tandem("models --help");  // as the top-level help says every command takes
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.rfind("usage: tandem models", 0), 0u) << r.output;
  r = run_tandem("models convnet");
  EXPECT_EQ(r.exit_code, 2) << r.output;

  // Names nothing answers to, and values a model cannot take, are the
  // command line's (a sweep found them exiting 1, some after the data were
  // read, or not at all).
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  const std::string data = " --data idx:" + dir.path() + " --max-steps 1 --progress off";
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"train --model foo", "--model: expected one of convnet, gpt2, gpt2-large, gpt2-medium, gpt2-tiny, "
                                 "gpt2-xl, gpt3-175b, llama-3-70b, llama-3-8b, llama-3.1-405b, llama-3.2-1b, llama-tiny, mixtral-8x7b, mixtral-tiny, mlp, mobilenetv2, qwen3-30b-a3b, qwen3-moe-tiny, resnet18, resnet34, "
                                 "resnet50, got 'foo'"},
           {"train --data bogus:x", "unknown data spec 'bogus:x'"},
           {"train --augment light", "--augment: expected one of none, cifar, imagenet, heavy, got 'light'"},
           {"eval --weights w.safetensors --augment light", "--augment: expected one of"},
           {"train --model mobilenetv2 --width-mult 1e19", "--width-mult: expected a number from 0.001 to 100"},
           {"train --lr -0.1", "--lr: expected a positive number up to 1e+300, got '-0.1'"},
           {"train --lr 0", "--lr: expected a positive number, got 0"},
           {"train" + data + " --model convnet --image-size 2",
            "--model convnet: convnet: image size must be at least 4, got 2 (the images are 2 x 2, from "
            "--image-size)"},
           {"train" + data + " --strategy pipeline --devices cpu,cpu --pipeline-split conv2 --pipeline-balance "
                             "params",
            "--pipeline-balance params chooses the stages when --pipeline-split does not; give one or the other"},
           {"train" + data + " --checkpoint-activations 100", "--checkpoint-activations 100: convnet has 12"},
           // The flags parsed into enums name every value they take.
           {"train --schedule zig", "--schedule: expected one of gpipe|1f1b|interleaved, got 'zig'"},
           {"train --dtype half", "--dtype: expected one of float32|float64, got 'half'"},
           {"eval --weights w.safetensors --dtype half", "--dtype: expected one of float32|float64, got 'half'"},
           {"train --dist-backend mpi", "--dist-backend: expected one of auto|gloo|nccl, got 'mpi'"},
           {"train --strategy zero", "--strategy: expected one of auto|none|ddp|allreduce|fsdp|dp|pipeline, "
                                     "got 'zero'"},
           {"train --max-restarts 1", "--max-restarts goes with --nproc-per-node N"},
           {"train --nproc-per-node 1,2 --max-restarts 1", "--max-restarts belongs to a single run"},
       }) {
    EXPECT_TRUE(testing::tandem_fails(args, 2, "tandem: error: " + message)) << args;
  }
}

// The flags that act over ranks, given to one process started alone, and
// others that change nothing in a run, are said to do nothing.
TEST(CliTest, FlagsWithNothingToActOnAreWarnedAbout) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  const std::string data = "train --data idx:" + dir.path() + " --progress off --epochs 1";
  auto r = run_tandem(data + " --max-steps 1 --strategy ddp --sync-bn --dist-timeout 5");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tandem: warning: --strategy ddp, --sync-bn, --dist-timeout 5: one process, no ranks to "
                          "act over; training as one process does (--nproc-per-node N starts N)"),
            std::string::npos) << r.output;
  r = run_tandem(data + " --max-steps 1 --model mlp --channels-last --batch-size 100");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tandem: warning: --channels-last: mlp has no 4-D weights (no convolutions); nothing "
                          "changes"),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tandem: warning: --batch-size 100 is more than the 64 training images: each step "
                          "takes all of them"),
            std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("one process, no ranks"), std::string::npos) << r.output;
  // --max-steps ending a run at an epoch's end: no epoch is partial, and
  // the table says why the rest did not run.
  r = run_tandem("train --data idx:" + dir.path() + " --batch-size 32 --epochs 3 --max-steps 2 --model mlp");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("stopped by --max-steps 2 after epoch 1 of 3"), std::string::npos) << r.output;
}

// What tandem prints must arrive: a full disk (/dev/full) lost the result
// table with exit 0.
TEST(CliTest, AnUnwritableStandardOutputIsAnError) {
  auto r = testing::run("sh -c '" + std::string(TANDEM_CLI) + " models > /dev/full'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem: error: cannot write to standard output: No space left on device"),
            std::string::npos) << r.output;
}

// libtorch's "Expected more than 1 value per channel" (BatchNorm on one
// sample at 1 x 1) gets the flags that avoid it.
TEST(CliTest, ABatchNormOfOneValueSaysWhichFlagsAvoidIt) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  auto r = run_tandem("train --data idx:" + dir.path() +
                      " --model resnet18 --image-size 4 --batch-size 1 --max-steps 1 --progress off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("Expected more than 1 value per channel when training"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("tandem: a BatchNorm layer got one value per channel: a batch (or micro-batch, or an "
                          "epoch's last batch) of one sample"),
            std::string::npos) << r.output;
}

// An allocation libtorch cannot make names bytes only; the CLI adds which
// flags ask for less. The mlp's first layer at 8192 x 8192 pixels needs
// 64 GiB, over the 16 GB of address space the test allows.
TEST(CliTest, OutOfMemorySaysWhichFlagsNeedLess) {
  auto r = testing::run("sh -c 'ulimit -v 16000000; " + std::string(TANDEM_CLI) +
               " train --model mlp --image-size 8192 --max-steps 1 --progress off'");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("can't allocate memory: you tried to allocate 68719476736 bytes"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("tandem: out of memory: a smaller --batch-size, --image-size or model needs less"),
            std::string::npos)
      << r.output;
}

// Note [memory limit]: a CPU run caps its address space at what it maps
// plus the memory available once its data are open, so that running out
// is the allocation error above (exit 1, the advice) and not the OOM
// killer's silent SIGKILL: --image-size 8192 on one process was killed.
TEST(CliTest, ACpuRunCannotOutgrowTheMachinesMemory) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 4096, 16);
  testing::run("(" TANDEM_CLI " train --data idx:" + dir.path() + " --model mlp --epochs 100 --progress lines > " +
               dir.file("out") + " 2>&1 &) > /dev/null 2>&1");
  std::string pid;
  for (int i = 0; i < 600 && pid.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (testing::read_text(dir.file("out")).find("epoch 1/100") == std::string::npos) continue;
    pid = testing::run("pgrep -f -- '^[^ ]*tandem train --data idx:" + dir.path() + " ' | head -1").output;
  }
  ASSERT_FALSE(pid.empty()) << testing::read_text(dir.file("out"));
  pid = pid.substr(0, pid.find('\n'));
  const std::string limits = testing::read_text("/proc/" + pid + "/limits");
  const std::string status = testing::read_text("/proc/" + pid + "/status");
  testing::run("kill " + pid);
  const auto line = limits.substr(limits.find("Max address space"));
  std::istringstream words(line.substr(std::string("Max address space").size()));
  std::string soft;
  words >> soft;
  ASSERT_NE(soft, "unlimited") << limits;
  std::istringstream meminfo(testing::read_text("/proc/meminfo"));
  std::string key;
  int64_t total_kib = 0;
  meminfo >> key >> total_kib;  // MemTotal
  const auto at = status.find("VmSize:");
  const int64_t vm_kib = std::stoll(status.substr(at + 7));
  EXPECT_LE(std::stoll(soft), (vm_kib + total_kib) * 1024) << limits << status;
}

TEST(CliTest, MissingDataDirectoryIsNamed) {
  auto r = run_tandem("train --data idx:/no/such/dir");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find("tandem: error: idx:/no/such/dir: no such directory"), std::string::npos)
      << r.output;
}

TEST(CliTest, TruncatedIdxFileIsNamed) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 100, 20);
  std::filesystem::resize_file(dir.file("train-images-idx3-ubyte"), 5000);
  auto r = run_tandem("train --data idx:" + dir.path());
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.output.find(dir.file("train-images-idx3-ubyte") + ": truncated"), std::string::npos)
      << r.output;
}

TEST(CliTest, CudaOnAMachineWithoutOneIsAClearError) {
  auto r = run_tandem("train --device cuda --max-steps 1");
  if (r.output.find("no CUDA device") == std::string::npos) {
    // A machine with a GPU trains instead; either way the exit code is defined.
    EXPECT_EQ(r.exit_code, 0) << r.output;
  } else {
    EXPECT_EQ(r.exit_code, 1) << r.output;
  }
}

TEST(CliTest, MaxStepsRunWritesItsMetricsLine) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 64);
  auto r = run_tandem("train --data idx:" + dir.path() + " --batch-size 32 --max-steps 3 --metrics-out " +
                      dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::read_text(dir.file("m.jsonl")));
  EXPECT_EQ(j["step"], 3);
  EXPECT_EQ(j["partial"], true);
  EXPECT_NE(r.output.find("stopped by --max-steps"), std::string::npos) << r.output;
}

// The first issue's acceptance run, as a learning check (Note [a learning
// check on Fashion-MNIST]): convnet on Fashion-MNIST.
TEST(CliTest, ConvnetLearnsFashionMnist) {
  TempDir dir;
  auto r = run_tandem(std::string("train --data fashion-mnist --model convnet --progress lines") +
                      testing::kLearningSteps + "--metrics-out " + dir.file("m.jsonl"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = nlohmann::json::parse(testing::read_text(dir.file("m.jsonl")));
  EXPECT_GE(j["test_acc"].get<double>(), testing::kLearnedAccuracy) << r.output;
  EXPECT_EQ(j["epoch"], 1);
  EXPECT_NE(r.output.find("test acc"), std::string::npos);
}

// tandem eval: the exported weights of a run give back that run's last test
// accuracy, in one process and split over 2 ranks; what does not fit is
// named.
TEST(CliTest, EvalGivesBackTheRunsTestAccuracy) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 512, 200);
  const std::string data = " --data idx:" + dir.path() + " --model convnet";
  auto r = run_tandem("train" + data + " --epochs 1 --batch-size 64 --progress off --metrics-out " +
                      dir.file("m.jsonl") + " --export-weights " + dir.file("w.safetensors"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  auto j = testing::last_metrics(dir.file("m.jsonl"));
  char expected[64];
  std::snprintf(expected, sizeof expected, "test accuracy %.2f%% (200 images)", 100 * j["test_acc"].get<double>());
  for (const std::string launch : {"", "launch --nproc-per-node 2 -- " TANDEM_CLI " "}) {
    r = run_tandem(launch + "eval --weights " + dir.file("w.safetensors") + data + " --batch-size 50");
    ASSERT_EQ(r.exit_code, 0) << launch << "\n" << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << launch << ": expected " << expected << "\n" << r.output;
  }

  // Trained over 2 ranks (Note [evaluation buffers]): the reported score is
  // that of the exported weights, not of each rank's own BatchNorm
  // statistics summed.
  for (const std::string strategy : {"ddp", "fsdp"}) {
    r = run_tandem("train --nproc-per-node 2 --strategy " + strategy + data +
                   " --epochs 1 --max-steps 5 --batch-size 32 --progress off --metrics-out " + dir.file("m2.jsonl") +
                   " --export-weights " + dir.file("w2.safetensors"));
    ASSERT_EQ(r.exit_code, 0) << r.output;
    j = testing::last_metrics(dir.file("m2.jsonl"));
    char want[64];
    std::snprintf(want, sizeof want, "test accuracy %.2f%% (200 images)", 100 * j["test_acc"].get<double>());
    r = run_tandem("eval --weights " + dir.file("w2.safetensors") + data + " --batch-size 50");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find(want), std::string::npos) << strategy << ": expected " << want << "\n" << r.output;
    const auto at = r.output.find("test loss ");
    ASSERT_NE(at, std::string::npos) << r.output;
    EXPECT_NEAR(std::atof(r.output.c_str() + at + 10), j["test_loss"].get<double>(), 6e-5) << strategy << "\n" << r.output;
  }

  EXPECT_TRUE(testing::tandem_fails("eval" + data, 2, "--weights FILE is required"));
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("w.safetensors") + " --data imagefolder:" + dir.path(), 2,
                                    "--data imagefolder:" + dir.path() + ": an image folder has no test split; give "
                                    "the images to evaluate on as --val-data imagefolder:DIR"));
  // Another --model is the command line's mistake, said before anything that follows from it.
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("w.safetensors") + " --data idx:" + dir.path() +
                                        " --model mlp",
                                    2, "tandem: error: --model mlp: " + dir.file("w.safetensors") +
                                           " holds the weights of convnet (its metadata)"));
  // Weights for other images: the tensor, then the flag (Note [shape settings]).
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("w.safetensors") + data + " --image-size 32", 1,
                                    "; --image-size: the weights were made for 28 x 28 images (their metadata), "
                                    "this run's model for 32 x 32 images"));
  // A file without that metadata (written by another program): the first
  // tensor that does not fit is named.
  auto file = checkpoint::read_safetensors(dir.file("w.safetensors"));
  checkpoint::write_safetensors(dir.file("bare.safetensors"), file.tensors);
  r = run_tandem("eval --weights " + dir.file("bare.safetensors") + " --data idx:" + dir.path() + " --model mlp");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // (the mlp's fc1 has another shape than the convnet's)
  EXPECT_NE(r.output.find("tandem: error: " + dir.file("bare.safetensors") + ": tensor 'fc1.weight' has shape"),
            std::string::npos) << r.output;
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("absent.safetensors") + data, 1,
                                    dir.file("absent.safetensors") + ": no such file (expected a safetensors file)"));

  // Note [normalisation in exports]: another IDX set as --data normalises
  // with its own statistics, not the training's; refused, naming both. As
  // --val-data beside the training --data it is evaluated.
  TempDir other;
  testing::write_synthetic_idx(other.path(), 512, 200);
  testing::write_idx(other.file("train-images-idx3-ubyte"), torch::randint(0, 256, {512, 28, 28}, torch::kInt64), false);
  r = run_tandem("eval --weights " + dir.file("w.safetensors") + " --data idx:" + other.path() + " --model convnet");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem: error: " + dir.file("w.safetensors") + ": trained on inputs normalised with mean ["),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(its metadata), but --data idx:" + other.path() + " normalises with mean ["),
            std::string::npos) << r.output;
  EXPECT_NE(r.output.find("; give as --data the data set the weights were trained on (images to evaluate on go in "
                          "--val-data)"),
            std::string::npos) << r.output;
  r = run_tandem("eval --weights " + dir.file("w.safetensors") + data + " --val-data idx:" + other.path());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("test accuracy"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("warning"), std::string::npos) << r.output;
  // Statistics that differ in the seventh digit are told apart in the message.
  auto edited = file.metadata;
  const double mean = std::stod(edited.at("normalize_mean").substr(1));
  char moved[64];
  std::snprintf(moved, sizeof moved, "[%.9f]", mean * (1 + 2e-6));
  edited["normalize_mean"] = moved;
  checkpoint::write_safetensors(dir.file("moved.safetensors"), file.tensors, edited);
  r = run_tandem("eval --weights " + dir.file("moved.safetensors") + data);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  char shown[64];
  std::snprintf(shown, sizeof shown, "with mean [%.8g] and std", mean * (1 + 2e-6));
  EXPECT_NE(r.output.find(shown), std::string::npos) << shown << "\n" << r.output;
  // One of the two: damaged; neither (older exports, other programs): a warning.
  edited = file.metadata;
  edited.erase("normalize_std");
  checkpoint::write_safetensors(dir.file("half.safetensors"), file.tensors, edited);
  EXPECT_TRUE(testing::tandem_fails("eval --weights " + dir.file("half.safetensors") + data, 1,
                                    dir.file("half.safetensors") + ": its metadata has normalize_mean but no "
                                    "normalize_std; tandem train --export-weights writes both"));
  edited.erase("normalize_mean");
  checkpoint::write_safetensors(dir.file("older.safetensors"), file.tensors, edited);
  r = run_tandem("eval --weights " + dir.file("older.safetensors") + data);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("tandem: warning: " + dir.file("older.safetensors") + ": its metadata does not say how the "
                          "inputs were normalised in training"),
            std::string::npos)
      << r.output;
}

}  // namespace
}  // namespace tandem
