// Sharded checkpoints of real jobs (Note [sharded checkpoints]): each rank
// writes only what it owns, and a checkpoint with a rank's file or its
// manifest missing, or a file altered, is named and passed over for the
// one before it. (That every layout's
// checkpoint resumes under every other, to the uninterrupted run's
// weights, is shown by the resume tests of mesh_cli_test.cpp and
// sync_bn_cli_test.cpp, whose jobs of several ranks write sharded ones.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "testing.h"

namespace tandem {
namespace {

using testing::run_tandem;
using testing::TempDir;

// Per file of the checkpoint, the elements of each tensor it holds.
using Holdings = std::map<std::string, std::map<std::string, int64_t>>;

Holdings holdings(const std::string& checkpoint) {
  const auto manifest = nlohmann::json::parse(testing::read_text(checkpoint + "/manifest.json"));
  Holdings held;
  for (const auto& file : manifest.at("files")) held[file.at("file").get<std::string>()];
  for (const auto& t : manifest.at("tensors")) {
    for (const auto& p : t.at("pieces")) {
      held[p.at("file").get<std::string>()][t.at("name").get<std::string>()] += p.at("numel").get<int64_t>();
    }
  }
  return held;
}

int64_t elements(const std::map<std::string, int64_t>& of) {
  int64_t n = 0;
  for (const auto& [name, count] : of) n += count;
  return n;
}

class ShardedCheckpointCliTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_synthetic_idx(data_.path(), 256, 64); }
  // Trains 4 steps with `flags`, a checkpoint at step 4; returns its holdings.
  Holdings train(const std::string& flags, const std::string& name) {
    const std::string dir = data_.file(name);
    auto r = run_tandem("train --data idx:" + data_.path() + " --model mlp --batch-size 32 --max-steps 4 "
                        "--checkpoint-every 4 --progress off --checkpoint-dir " + dir + " " + flags);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(std::filesystem::is_directory(dir + "/checkpoint-00000004")) << flags;
    return holdings(dir + "/checkpoint-00000004");
  }
  TempDir data_;
};

// mlp: fc1 (784 x 256 + 256), fc2 (256 x 128 + 128), fc3 (128 x 10 + 10):
// 235146 parameters, as many momentum elements.
constexpr int64_t kParameters = 235146;

TEST_F(ShardedCheckpointCliTest, EachRankWritesOnlyWhatItOwns) {
  // DDP: the replicas' weights and momentum from the first alone.
  auto ddp = train("--nproc-per-node 2", "ddp");
  EXPECT_EQ(elements(ddp["rank-0.pt"]), 2 * kParameters);
  EXPECT_EQ(elements(ddp["rank-1.pt"]), 0);
  // FSDP: each rank its half of every unit's parameters and momentum.
  auto fsdp = train("--nproc-per-node 2 --strategy fsdp --fsdp-min-unit-params 0", "fsdp");
  for (const char* file : {"rank-0.pt", "rank-1.pt"}) {
    EXPECT_NEAR(static_cast<double>(elements(fsdp[file])), kParameters, 300) << file;
  }
  // ZeRO-1: the weights from the first rank, the momentum from its owners.
  auto zero = train("--nproc-per-node 2 --shard-optimizer", "zero");
  EXPECT_EQ(elements(zero["rank-0.pt"]) + elements(zero["rank-1.pt"]), 2 * kParameters);
  EXPECT_GT(elements(zero["rank-1.pt"]), 0);
  for (const auto& [name, count] : zero["rank-1.pt"]) EXPECT_EQ(name.rfind("optimizer.", 0), 0u) << name;
  // A pipeline over 2 ranks: each stage's own tensors (fc1 on the first, fc3 on the second).
  auto pipeline = train("--nproc-per-node 2 --strategy pipeline", "pipeline");
  EXPECT_TRUE(pipeline["rank-0.pt"].count("model.fc1.weight"));
  EXPECT_TRUE(pipeline["rank-1.pt"].count("model.fc3.weight"));
  EXPECT_EQ(elements(pipeline["rank-0.pt"]) + elements(pipeline["rank-1.pt"]), 2 * kParameters);
  // dp=2 x pp=2: the first replica of each stage.
  auto mesh = train("--nproc-per-node 4 --mesh dp=2,pp=2", "mesh");
  EXPECT_GT(elements(mesh["rank-0.pt"]), 0);
  EXPECT_EQ(elements(mesh["rank-1.pt"]), 0);
  EXPECT_GT(elements(mesh["rank-2.pt"]), 0);
  EXPECT_EQ(elements(mesh["rank-3.pt"]), 0);
  // --checkpoint-format file: rank 0 gathers and writes one file.
  auto r = run_tandem("train --data idx:" + data_.path() + " --model mlp --batch-size 32 --max-steps 4 "
                      "--checkpoint-every 4 --progress off --checkpoint-format file --nproc-per-node 2 "
                      "--strategy fsdp --checkpoint-dir " + data_.file("file"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::is_regular_file(data_.file("file/checkpoint-00000004.pt")));
}

// A sharded checkpoint with a rank's file gone, altered on disk, or taken
// from another checkpoint is damaged: --resume says so and goes on from the
// one before it, and tandem export says it passed it over.
TEST_F(ShardedCheckpointCliTest, ADamagedOrForeignRankFileFallsBackToThePreviousOne) {
  const std::string common = "train --data idx:" + data_.path() + " --model mlp --batch-size 32 --progress lines "
                             "--nproc-per-node 2 --strategy fsdp --checkpoint-every 2";
  const std::string written = data_.file("written");
  auto first = run_tandem(common + " --max-steps 4 --checkpoint-dir " + written);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  for (const std::string how : {"removed", "altered", "foreign", "manifest", "file"}) {
    const std::string dir = data_.file(how);
    std::filesystem::copy(written, dir, std::filesystem::copy_options::recursive);
    const std::string newest = dir + "/checkpoint-00000004", rank1 = newest + "/rank-1.pt";
    if (how == "removed") {
      std::filesystem::remove(rank1);
    } else if (how == "manifest") {  // a folder so named is no checkpoint without it: named, not ignored
      std::filesystem::remove(newest + "/manifest.json");
      auto direct = run_tandem("export --checkpoint " + newest + " --out " + data_.file("direct.safetensors"));
      EXPECT_EQ(direct.exit_code, 1) << direct.output;
      EXPECT_NE(direct.output.find("manifest.json: no such file"), std::string::npos) << direct.output;
    } else if (how == "file") {  // a plain file in the folder's place: named, not skipped
      std::filesystem::remove_all(newest);
      std::ofstream(newest) << "not a checkpoint";
    } else if (how == "foreign") {
      std::filesystem::copy_file(dir + "/checkpoint-00000002/rank-1.pt", rank1,
                                 std::filesystem::copy_options::overwrite_existing);
    } else {
      std::fstream file(rank1, std::ios::in | std::ios::out | std::ios::binary);
      file.seekp(100);
      file.put('\x7f');
    }
    auto exported = run_tandem("export --checkpoint " + dir + " --out " + data_.file(how + ".safetensors"));
    EXPECT_EQ(exported.exit_code, 0) << exported.output;
    EXPECT_NE(exported.output.find("warning: passed over " + newest + ": " +
                                   (how == "manifest" ? "damaged: manifest.json"
                                    : how == "file"   ? ""
                                                      : "damaged: rank-1.pt")),
              std::string::npos)
        << exported.output;
    EXPECT_NE(exported.output.find("(step 2, "), std::string::npos) << exported.output;
    auto resumed = run_tandem(common + " --max-steps 6 --resume --checkpoint-dir " + dir);
    ASSERT_EQ(resumed.exit_code, 0) << how << "\n" << resumed.output;
    EXPECT_NE(resumed.output.find("warning: cannot resume from " + newest + ": damaged"), std::string::npos)
        << how << "\n" << resumed.output;
    const std::string why = how == "removed"    ? ": damaged: rank-1.pt: no such file"
                            : how == "altered"  ? ": damaged: rank-1.pt: its CRC-32 does not match"
                            : how == "manifest" ? ": damaged: manifest.json"
                            : how == "file"     ? ": damaged"
                                                : ": damaged: rank-1.pt is a file of another checkpoint";
    EXPECT_NE(resumed.output.find(why), std::string::npos) << resumed.output;
    EXPECT_NE(resumed.output.find("resumed from " + dir + "/checkpoint-00000002 (epoch 1, step 2)"),
              std::string::npos) << how << "\n" << resumed.output;
  }
}

}  // namespace
}  // namespace tandem
