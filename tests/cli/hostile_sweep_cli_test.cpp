// A hostile user's sweep, kept so that the next such defect is found here:
// bad flags, non-finite and out-of-range numbers, flags that do not go
// together, and a job the machine cannot hold. Every command line names a
// data folder that is not there, so a mistake found only after the data
// were read shows up as that folder's error (exit 1) instead of the flag's
// (exit 2): usage errors are found before any data is read. Special files,
// diverged runs and frozen or killed ranks have suites of their own
// (SpecialFilesCliTest, DivergenceCliTest, FrozenRankCliTest,
// DistributedCliTest).
#include <ostream>
#include <string>

#include <gtest/gtest.h>

#include "same_weights.h"
#include "testing.h"

namespace tandem {
namespace {

struct Case {
  const char* flags;
  const char* message;  // in the one line of the error
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.flags; }

const Case kUsageErrors[] = {
    // Numbers: out of range, not finite, not numbers.
    {"--lr 0", "--lr: expected a positive number, got 0"},
    {"--lr 1e308", "--lr: expected a positive number up to 1e+300, got '1e308'"},
    {"--lr 1e309", "--lr: expected a positive number up to 1e+300, got '1e309'"},
    {"--lr nan", "--lr: expected a positive number up to 1e+300, got 'nan'"},
    {"--lr 1e39", "--lr 1e+39: beyond the largest float32"},
    {"--momentum 1", "--momentum: expected [0, 1), got 1"},
    {"--momentum nan", "--momentum: expected a number >= 0, got 'nan'"},
    {"--weight-decay inf", "--weight-decay: expected a number >= 0, got 'inf'"},
    {"--clip-grad-norm inf", "--clip-grad-norm: expected a number >= 0, got 'inf'"},
    {"--dist-timeout inf", "--dist-timeout: expected a number from 0.001 to 604800, got 'inf'"},
    {"--label-smoothing 1", "--label-smoothing: expected [0, 1), got 1"},
    {"--warmup-epochs 10", "--warmup-epochs: expected [0, --epochs), got 10"},
    {"--min-lr 1", "--min-lr 1: expected 0 to --lr (0.1)"},
    {"--bucket-cap-mb nan", "--bucket-cap-mb: expected a number from 0.001 to 1e+06, got 'nan'"},
    {"--epochs 0", "--epochs: expected a positive integer, got '0'"},
    {"--batch-size abc", "--batch-size: expected a positive integer, got 'abc'"},
    {"--seed -1", "--seed: expected an integer from 0 to 18446744073709551615, got '-1'"},
    {"--workers 5000", "--workers: expected 0 to 1024, got 5000"},
    {"--nproc-per-node 5000", "--nproc-per-node: expected a number from 0 to 4096"},
    // Sizes the model cannot take, and counts of its layers.
    {"--image-size 9000", "--image-size: expected 1 to 8192 pixels (0: the format's default), got 9000"},
    {"--image-size 3", "--model convnet: convnet: image size must be at least 4, got 3 (the images are 3 x 3, "
                       "from --image-size)"},
    {"--model mobilenetv2 --width-mult 1e9", "--width-mult: expected a number from 0.001 to 100, got '1e9'"},
    {"--checkpoint-activations 100", "--checkpoint-activations 100: convnet has 12 top-level layers"},
    {"--strategy pipeline --devices cpu,cpu --pipeline-split nosuchlayer",
     "--pipeline-split: no layer 'nosuchlayer' in the model (its layers: conv1, bn1"},
    {"--strategy pipeline --devices cpu,cpu --schedule interleaved --virtual-stages 50",
     "pipeline: the model has 12 layers, fewer than the 100 stages (2 devices x --virtual-stages 50)"},
    {"--strategy pipeline --devices cpu,cpu --micro-batches 1000", "--micro-batches 1000: more than the 256 samples"},
    // Names nothing answers to.
    {"--model resnet99", "--model: expected one of convnet, gpt2"},
    {"--augment fancy", "--augment: expected one of none, cifar, imagenet, heavy, got 'fancy'"},
    {"--amp fp8", "--amp: expected one of off|bf16|fp16, got 'fp8'"},
    {"--strategy warp", "--strategy: expected one of auto|none|ddp|allreduce|fsdp|dp|pipeline, got 'warp'"},
    {"--device tpu", "--device: expected cpu, cuda or cuda:N, got 'tpu'"},
    {"--strategy dp --devices cpu,tpu", "--devices: expected a comma-separated list of cpu, cuda or cuda:N"},
    {"--unknown-flag", "unknown flag --unknown-flag"},
    {"stray", "unexpected argument 'stray'"},
    // Flags that do not go together.
    {"--amp bf16 --dtype float64", "--amp bf16 needs --dtype float32"},
    {"--micro-batches 2", "--micro-batches goes with a pipeline (--strategy pipeline, or --mesh with pp > 1)"},
    {"--cuda-graph", "--cuda-graph needs --device cuda"},
    {"--resume", "--resume needs --checkpoint-dir"},
    {"--init-weights-except fc", "--init-weights-except goes with --init-weights"},
    {"--shard-optimizer --strategy fsdp", "--shard-optimizer does not go with --strategy fsdp"},
    {"--max-restarts 2", "--max-restarts goes with --nproc-per-node N"},
    {"--batch-size 8 --batch-per-process 4", "give --batch-size (the global batch) or --batch-per-process"},
    {"--nproc-per-node 2 --strategy dp --devices cpu,cpu", "--strategy dp runs in one process over --devices"},
    {"--nproc-per-node 3", "--batch-size 256: not divisible by the world size 3"},
    {"--metrics-out m.jsonl --export-weights m.jsonl", "name the same file: each needs its own"},
};

TEST(HostileSweepCliTest, EachIsAUsageErrorBeforeAnyDataIsRead) {
  for (const Case& c : kUsageErrors) {
    SCOPED_TRACE(c.flags);
    testing::TempDir dir;
    const auto r = testing::run("cd " + dir.path() + " && timeout 120 " + std::string(TANDEM_CLI) +
                                " train --data idx:" + dir.file("no-such-folder") + " --max-steps 1 --progress off " +
                                c.flags);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    const auto at = r.output.find("tandem: error: ");
    if (at == std::string::npos) {
      ADD_FAILURE() << "no error line:\n" << r.output;
      continue;
    }
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_NE(line.find(c.message), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("no-such-folder"), std::string::npos) << "the data were looked at first\n" << r.output;
  }
}

// Note [worker footprint]: CPU workers the machine's memory cannot hold are
// refused, with the figures, before any starts; the same job with a small
// batch (the control) starts and trains.
TEST(ResourceCheckCliTest, WorkersTheMemoryCannotHoldAreRefusedWithTheFigures) {
  testing::TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  const std::string job = "train --nproc-per-node 2 --data idx:" + dir.path() +
                          " --model resnet50 --image-size 224 --max-steps 1 --epochs 1 --progress off";
  // About 0.1 GB of activations a sample at 224 x 224: 2 x 1000 of them
  // is more memory than any machine of this kind has.
  auto r = testing::run_tandem(job + " --batch-per-process 1000");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("tandem: error: --nproc-per-node 2: 2 workers x about "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("for the activations of a step at the worker's batch of 1000, scaled from 4) = "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("of memory this machine has available; start fewer workers, give a smaller "
                          "--batch-size, or --skip-resource-check"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[rank "), std::string::npos) << "a worker started\n" << r.output;
  r = testing::run_tandem(job + " --batch-per-process 2");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Note [gloo's threads], [terminate message]: a job at its address-space
// limit ends with an error message and exit 1 wherever the limit strikes
// (the process group's threads, a tensor, the data), never a signal and
// never a hang: within 90 s (`timeout` exits 124), where a rank whose Gloo
// group failed to start its second thread blocked until its peers' 300 s
// --dist-timeout.
TEST(ResourceCheckCliTest, WorkersAtTheirAddressSpaceLimitEndWithAMessage) {
  testing::TempDir dir;
  const std::string job = " train --model mixtral-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --max-steps 2 --progress off --nproc-per-node 2 --mesh ep=2";
  for (const char* limit : {"2800000", "2850000", "2900000", "3000000", "3000000", "3200000"}) {
    auto r = testing::run("sh -c 'ulimit -v " + std::string(limit) + "; timeout 90 " + std::string(TANDEM_CLI) +
                          job + "'");
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 1) << limit << " KiB\n" << r.output;
    EXPECT_EQ(r.output.find("by signal"), std::string::npos) << limit << " KiB\n" << r.output;
    EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << limit << " KiB\n" << r.output;
  }
}

}  // namespace
}  // namespace tandem
