// `tandem train --tensorboard DIR`: event files read back by TensorBoard's
// own reader (the tensorboard package of the test venv, which checks every
// record's checksums), their scalars against --metrics-out.
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tandem/util/table.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::run_tandem;
using testing::TempDir;

using Series = std::vector<std::pair<int64_t, double>>;  // step, value

struct Board {
  std::map<std::string, Series> scalars;
  int64_t files = 0;
};

// What TensorBoard's EventAccumulator makes of the folder: every scalar
// series, after its purges of what a restart left behind.
Board read_board(const std::string& folder) {
  TempDir dir;
  const std::string script = dir.file("read.py");
  {
    std::ofstream out(script);
    out << "import json, os, sys\n"
           "from tensorboard.backend.event_processing.event_accumulator import EventAccumulator\n"
           "folder = sys.argv[1]\n"
           "acc = EventAccumulator(folder, size_guidance={'scalars': 0})\n"
           "acc.Reload()\n"
           "scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()['scalars']}\n"
           "files = [f for f in os.listdir(folder) if 'tfevents' in f]\n"
           "print('BOARD ' + json.dumps({'scalars': scalars, 'files': len(files)}))\n";
  }
  auto r = run(std::string(TANDEM_PYTHON) + " " + script + " " + folder);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  Board board;
  const auto at = r.output.find("BOARD ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "the reader printed no board: " << r.output;
    return board;
  }
  auto j = nlohmann::json::parse(r.output.substr(at + 6, r.output.find('\n', at) - at - 6));
  board.files = j["files"].get<int64_t>();
  for (auto& [tag, points] : j["scalars"].items()) {
    for (auto& point : points) board.scalars[tag].emplace_back(point[0].get<int64_t>(), point[1].get<double>());
  }
  return board;
}

std::vector<nlohmann::json> metrics_lines(const std::string& path) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(testing::read_text(path));
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::json::parse(line));
  }
  return lines;
}

std::vector<int64_t> steps_of(const Series& series) {
  std::vector<int64_t> steps;
  for (const auto& point : series) steps.push_back(point.first);
  return steps;
}

class TensorBoardCliTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    data_ = new TempDir();
    testing::write_synthetic_idx(data_->path(), 1024, 64);  // 32 steps an epoch at batch 32
  }
  static void TearDownTestSuite() {
    delete data_;
    data_ = nullptr;
  }
  static std::string job() {
    return " train --data idx:" + data_->path() + " --model convnet --epochs 2 --batch-size 32 --lr 0.05 --seed 7"
           " --progress off --log-every 3";
  }
  static TempDir* data_;
};
TempDir* TensorBoardCliTest::data_ = nullptr;

// Each epoch's figures equal --metrics-out's (as the float TensorBoard
// keeps); the step records come every --log-every steps and at each epoch's
// end, and their losses, weighted by steps, average to the epoch's loss.
TEST_F(TensorBoardCliTest, ItsOwnReaderReturnsEachEpochsMetrics) {
  TempDir out;
  const std::string board_dir = out.file("board"), metrics = out.file("metrics.jsonl");
  auto r = run_tandem(job() + " --nproc-per-node 2 --tensorboard " + board_dir + " --metrics-out " + metrics);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto lines = metrics_lines(metrics);
  ASSERT_EQ(lines.size(), 2u);
  const Board board = read_board(board_dir);
  EXPECT_EQ(board.files, 1) << "rank 0 alone writes";
  for (const char* key : {"train_loss", "train_acc", "test_loss", "test_acc", "epoch_seconds", "images_per_second",
                          "lr", "world_size", "partial"}) {
    const std::string tag = std::string("epoch/") + key;
    ASSERT_EQ(board.scalars.count(tag), 1u) << tag;
    const Series& series = board.scalars.at(tag);
    ASSERT_EQ(series.size(), 2u) << tag;
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_EQ(series[e].first, lines[e]["step"].get<int64_t>()) << tag;
      const auto& value = lines[e][key];
      const double want = value.is_boolean() ? (value.get<bool>() ? 1.0 : 0.0) : value.get<double>();
      EXPECT_EQ(series[e].second, static_cast<double>(static_cast<float>(want))) << tag << " in epoch " << e + 1;
    }
  }
  std::vector<int64_t> want;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    for (int64_t b = 3; b <= 32; b += 3) want.push_back(epoch * 32 + b);
    want.push_back(epoch * 32 + 32);
  }
  for (const char* tag : {"train/loss", "train/lr", "train/samples_per_second", "train/step_seconds"}) {
    ASSERT_EQ(board.scalars.count(tag), 1u) << tag;
    EXPECT_EQ(steps_of(board.scalars.at(tag)), want) << tag;
  }
  EXPECT_EQ(board.scalars.count("train/loss_scale"), 0u) << "no fp16, no gradient scale";
  const Series& loss = board.scalars.at("train/loss");
  int64_t previous = 0;
  double weighted = 0.0;
  size_t epoch = 0;
  for (const auto& [step, value] : loss) {
    weighted += value * static_cast<double>(step - previous);
    previous = step;
    if (step % 32 == 0) {
      const double train_loss = lines[epoch]["train_loss"].get<double>();
      EXPECT_NEAR(weighted / 32, train_loss, 1e-6 * train_loss) << "epoch " << epoch + 1;
      EXPECT_EQ(board.scalars.at("train/lr")[steps_of(loss).size() / 2 * (epoch + 1) - 1].second,
                static_cast<double>(static_cast<float>(lines[epoch]["lr"].get<double>())));
      weighted = 0.0;
      ++epoch;
    }
  }
}

TEST_F(TensorBoardCliTest, Fp16RecordsItsGradientScale) {
  TempDir out;
  const std::string board_dir = out.file("board");
  auto r = run_tandem(job() + " --max-steps 12 --amp fp16 --progress lines --tensorboard " + board_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const Board board = read_board(board_dir);
  ASSERT_EQ(board.scalars.count("train/loss_scale"), 1u);
  const Series& scale = board.scalars.at("train/loss_scale");
  EXPECT_EQ(steps_of(scale), (std::vector<int64_t>{3, 6, 9, 12}));
  // The last record's scale is the one printed after the (cut short) epoch.
  std::ostringstream printed;
  printed << "fp16 loss scale " << scale.back().second << " after this epoch";
  EXPECT_NE(r.output.find(printed.str()), std::string::npos) << printed.str() << "\n" << r.output;
}

// A run resumed from its step-20 checkpoint, after it had gone on to step
// 25 and recorded a cut-short epoch there: TensorBoard keeps the first
// file's records up to step 20 and the resumed run's after it, nothing of
// steps 21 to 25 twice, and no epoch at step 25.
TEST_F(TensorBoardCliTest, AResumedRunReplacesWhatCameAfterItsCheckpoint) {
  TempDir out;
  const std::string board_dir = out.file("board"), checkpoints = out.file("ck"), metrics = out.file("m.jsonl");
  const std::string common = job() + " --tensorboard " + board_dir + " --checkpoint-dir " + checkpoints +
                             " --checkpoint-every 10 --metrics-out " + metrics;
  auto r = run_tandem(common + " --max-steps 25 --progress lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_TRUE(std::filesystem::remove(checkpoints + "/checkpoint-00000025.pt"));
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the second file's name sorts after the first's
  r = run_tandem(common + " --resume --progress lines");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  ASSERT_NE(r.output.find("resumed from " + checkpoints + "/checkpoint-00000020.pt"), std::string::npos) << r.output;
  const Board board = read_board(board_dir);
  EXPECT_EQ(board.files, 2);
  EXPECT_EQ(steps_of(board.scalars.at("epoch/train_loss")), (std::vector<int64_t>{32, 64}));
  const auto steps = steps_of(board.scalars.at("train/loss"));
  for (size_t i = 1; i < steps.size(); ++i) EXPECT_LT(steps[i - 1], steps[i]) << "a step recorded twice";
  EXPECT_EQ(steps.front(), 3);
  EXPECT_EQ(steps.back(), 64);
  const auto lines = metrics_lines(metrics);  // the cut-short epoch, then the resumed run's two
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(board.scalars.at("epoch/test_acc").back().second,
            static_cast<double>(static_cast<float>(lines.back()["test_acc"].get<double>())));
}

// Refused before training, and before --metrics-out empties what it held.
TEST_F(TensorBoardCliTest, AFolderThatCannotBeOneIsNamedBeforeTraining) {
  TempDir out;
  const std::string file = out.file("a-file"), metrics = out.file("kept.jsonl");
  { std::ofstream(file) << "x"; }
  { std::ofstream(metrics) << "{\"an earlier line\":1}\n"; }
  auto r = run_tandem(job() + " --tensorboard " + file + " --metrics-out " + metrics);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--tensorboard " + file + ": is a regular file; expected a folder"), std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("epoch 1"), std::string::npos) << "refused before training:\n" << r.output;
  EXPECT_EQ(testing::read_text(metrics), "{\"an earlier line\":1}\n");
  ASSERT_EQ(::symlink(out.file("nowhere").c_str(), out.file("dangling").c_str()), 0);
  r = run_tandem(job() + " --tensorboard " + out.file("dangling"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--tensorboard " + out.file("dangling") + ": is a link to nothing; expected a folder"),
            std::string::npos) << r.output;
  r = run_tandem(job() + " --tensorboard " + file + "/below");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("is a regular file, not a folder"), std::string::npos) << r.output;
  r = run_tandem(job() + " --log-every 0");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--log-every"), std::string::npos) << r.output;
}

// A fresh run into a folder that holds an earlier run's event file: said,
// and TensorBoard shows the new run alone there (a session start at step
// 0), not two runs' steps mixed.
TEST_F(TensorBoardCliTest, AFreshRunInAUsedFolderReplacesTheEarlierRun) {
  TempDir out;
  const std::string board_dir = out.file("board");
  auto r = run_tandem(job() + " --max-steps 12 --tensorboard " + board_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));  // the second file's name sorts after the first's
  r = run_tandem(job() + " --max-steps 6 --progress lines --tensorboard " + board_dir);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("--tensorboard " + board_dir + " held 1 event file(s) of an earlier run"),
            std::string::npos) << r.output;
  const Board board = read_board(board_dir);
  EXPECT_EQ(board.files, 2);
  EXPECT_EQ(steps_of(board.scalars.at("train/loss")), (std::vector<int64_t>{3, 6}));
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// A mixture of experts logs its routing every record: transformers'
// load-balancing loss and each expert's share of the (token, expert)
// pairs, over every layer and token of the job. mixtral-tiny in float64:
// one process, two data ranks (each its half of the tokens), a pipeline
// of two stages (each its half of the layers) and two tp ranks (which
// route alike) record the same figures.
TEST(TensorBoardRouterCliTest, AMixtureOfExpertsLogsItsRoutingOverTheJob) {
  TempDir dir;
  const std::string job = "train --model mixtral-tiny --data text:" + testing::write_text(dir) +
                          " --seq-len 16 --batch-size 8 --max-steps 4 --log-every 2 --dtype float64 --progress off";
  std::vector<Board> boards;
  for (const std::string mesh : {"", "--nproc-per-node 2 --mesh dp=2", "--nproc-per-node 2 --mesh pp=2",
                                 "--nproc-per-node 2 --mesh tp=2"}) {
    const std::string folder = dir.file("tb" + std::to_string(boards.size()));
    auto r = run_tandem(job + " " + mesh + " --tensorboard " + folder);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    boards.push_back(read_board(folder));
  }
  const auto& one = boards.front().scalars;
  ASSERT_EQ(one.count("router/balance_loss"), 1u);
  ASSERT_EQ(steps_of(one.at("router/balance_loss")), (std::vector<int64_t>{2, 4}));
  double shares = 0;
  for (int e = 0; e < 8; ++e) shares += one.at(format("router/expert_%03d_share", e)).back().second;
  EXPECT_NEAR(shares, 1.0, 1e-6);  // TensorBoard keeps float32
  const double balance = one.at("router/balance_loss").back().second;
  EXPECT_GE(balance, 0.99);  // 1 for a uniform spread, up to 8
  EXPECT_LE(balance, 8.0);
  for (size_t i = 1; i < boards.size(); ++i) {
    for (const auto& [tag, series] : one) {
      if (tag.rfind("router/", 0) != 0) continue;
      ASSERT_EQ(boards[i].scalars.count(tag), 1u) << tag << " in layout " << i;
      const auto& theirs = boards[i].scalars.at(tag);
      ASSERT_EQ(theirs.size(), series.size()) << tag;
      for (size_t k = 0; k < series.size(); ++k) {
        EXPECT_NEAR(theirs[k].second, series[k].second, 1e-6 * std::max(1.0, series[k].second))
            << tag << " at step " << series[k].first << " in layout " << i;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
