// What the Trainer's tests share: a small run on synthetic data, the
// model's state, and a fixture that writes the data set.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "tandem/engine/trainer.h"
#include "tandem/util/check.h"
#include "testing.h"

namespace tandem::engine {

// A small run on synthetic data: 512 training images, batch 64, 8 steps/epoch.
inline TrainOptions small_run(const std::string& data_dir) {
  TrainOptions o;
  o.data = "idx:" + data_dir;
  o.model = "convnet";
  o.epochs = 2;
  o.batch_size = 64;
  o.lr = 0.05;
  o.seed = 11;
  o.progress = ProgressMode::kOff;
  return o;
}

inline std::vector<std::pair<std::string, torch::Tensor>> state_of(Trainer& trainer) {
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& p : trainer.model()->named_parameters()) state.emplace_back(p.key(), p.value().clone());
  for (const auto& b : trainer.model()->named_buffers()) state.emplace_back(b.key(), b.value().clone());
  return state;
}

inline void expect_equal_states(const std::vector<std::pair<std::string, torch::Tensor>>& a,
                         const std::vector<std::pair<std::string, torch::Tensor>>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
  }
}

// Options the Trainer refuses when constructed, with a message containing `why`.
inline void refused(const TrainOptions& bad, const std::string& why) {
  try {
    Trainer t(bad, nullptr);
    ADD_FAILURE() << "accepted: " << why;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
}

// The names of the files in `dir`, sorted, but the writer's lock file
// (.tandem-lock, which stays).
inline std::vector<std::string> file_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().filename() != ".tandem-lock") names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Runs a Trainer with `o` and returns what it printed on its log.
inline std::string run_logged(const TrainOptions& o) {
  char* text = nullptr;
  size_t length = 0;
  std::FILE* log = open_memstream(&text, &length);
  Trainer(o, log).run();
  std::fclose(log);
  std::string output(text, length);
  std::free(text);
  return output;
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override { testing::write_synthetic_idx(data_.path(), 512, 256); }
  testing::TempDir data_;
};

}  // namespace tandem::engine
