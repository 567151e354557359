// tandem export: any checkpoint, whatever layout wrote it, becomes one
// safetensors file under the model's names, equal to what --export-weights
// writes at the same step, with its metadata, which tandem eval reads.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tandem/checkpoint/safetensors.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

// Trains 6 steps with `layout`, checkpoints every 3 and exports the final
// weights; `tandem export` of the checkpoint folder (its newest: step 6)
// must give the same tensors bit for bit, and the same metadata but the
// step, and tandem eval on it the run's last test accuracy.
void expect_export_is_the_runs_weights(const std::string& layout) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 256, 64);
  auto r = run_tandem("train --data idx:" + dir.path() + " --model convnet --dtype float64 --batch-size 32 "
                      "--max-steps 6 --epochs 1 --progress off --checkpoint-dir " + dir.file("ck") +
                      " --checkpoint-every 3 --export-weights " + dir.file("run.safetensors") + " --metrics-out " +
                      dir.file("m.jsonl") + " " + layout);
  ASSERT_EQ(r.exit_code, 0) << layout << "\n" << r.output;
  auto e = run_tandem("export --checkpoint " + dir.file("ck") + " --out " + dir.file("ck.safetensors"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("(step 6, 16 tensors) written to"), std::string::npos) << e.output;
  auto run = checkpoint::read_safetensors(dir.file("run.safetensors"));
  auto exported = checkpoint::read_safetensors(dir.file("ck.safetensors"));
  ASSERT_EQ(run.tensors.size(), exported.tensors.size());
  std::map<std::string, torch::Tensor> by_name(exported.tensors.begin(), exported.tensors.end());
  for (const auto& [name, tensor] : run.tensors) {
    ASSERT_EQ(by_name.count(name), 1u) << layout << ": " << name << " not exported";
    EXPECT_TRUE(torch::equal(tensor, by_name[name])) << layout << ": " << name;
  }
  auto metadata = exported.metadata;
  EXPECT_EQ(metadata["checkpoint_step"], "6");
  metadata.erase("checkpoint_step");
  EXPECT_EQ(metadata, run.metadata) << layout;
  auto eval = run_tandem("eval --weights " + dir.file("ck.safetensors"));
  ASSERT_EQ(eval.exit_code, 0) << eval.output;
  const auto last = testing::last_metrics(dir.file("m.jsonl"));
  char accuracy[32];
  std::snprintf(accuracy, sizeof accuracy, "test accuracy %.2f%%", 100 * last["test_acc"].get<double>());
  EXPECT_NE(eval.output.find(accuracy), std::string::npos) << eval.output << " (expected " << accuracy << ")";
}

TEST(ExportCliTest, ACheckpointOfAnyLayoutExportsTheRunsWeights) {
  expect_export_is_the_runs_weights("--nproc-per-node 0");
  expect_export_is_the_runs_weights("--nproc-per-node 4 --mesh dp=2,pp=2 --sync-bn");
  expect_export_is_the_runs_weights("--nproc-per-node 4 --mesh dp=2,pp=2 --strategy fsdp --sync-bn");
}

// What cannot be exported is named, with exit 2 for the command line's
// mistakes and 1 for the files'.
TEST(ExportCliTest, BadInputIsNamed) {
  TempDir dir;
  EXPECT_TRUE(testing::tandem_fails("export --out " + dir.file("w.safetensors"), 2, "--checkpoint PATH is required"));
  EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.path(), 2, "--out FILE is required"));
  EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.path() + " --out " + dir.file("w.safetensors"), 1,
                                    dir.path() + ": no checkpoint in this folder"));
  // A path that is not there is named once.
  const auto missing = testing::run_tandem("export --checkpoint " + dir.file("nope") + " --out " +
                                           dir.file("w.safetensors"));
  EXPECT_NE(missing.output.find("tandem: error: " + dir.file("nope") + ": no such file (expected a checkpoint file)\n"),
            std::string::npos)
      << missing.output;
  EXPECT_EQ(missing.output.find("nope: " + dir.file("nope")), std::string::npos) << missing.output;
  std::ofstream(dir.file("checkpoint-00000003.pt")) << "not a checkpoint";
  EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.file("checkpoint-00000003.pt") + " --out " +
                                        dir.file("w.safetensors"),
                                    1, dir.file("checkpoint-00000003.pt") + ": damaged: no tandem checksum trailer"));
  EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.path() + " --out " + dir.file("w.safetensors"), 1,
                                    "every checkpoint in it is damaged"));
  EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.path() + " --out " + dir.path(), 2,
                                    "--out " + dir.path() + ": is a checkpoint's file"));
  // Never over the checkpoint read: its file, or a file of a sharded one.
  for (const std::string& out : {dir.file("checkpoint-00000003.pt"), dir.file("checkpoint-00000004") + "/rank-0.pt"}) {
    EXPECT_TRUE(testing::tandem_fails("export --checkpoint " + dir.path() + " --out " + out, 2,
                                      "is a checkpoint's file, or in a checkpoint's folder"))
        << out;
  }
  EXPECT_EQ(testing::read_text(dir.file("checkpoint-00000003.pt")), "not a checkpoint");
  EXPECT_FALSE(std::filesystem::exists(dir.file("w.safetensors")));
}

}  // namespace
}  // namespace tandem
