// The library as a user of it gets it: `cmake --install` of this build, then
// examples/ built as a project of its own against the install
// (find_package(tandem)), and each of its programs run: ddp alone and as 2
// ranks under the installed `tandem launch`, data_parallel, pipeline with
// both schedules, and average_gradients with the workers it starts.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "tandem/version.h"
#include "testing.h"

namespace tandem {
namespace {

using testing::run;
using testing::TempDir;

// "epoch N: loss X" lines, in order.
std::vector<double> epoch_losses(const std::string& output) {
  std::vector<double> losses;
  std::regex line("epoch [0-9]+: loss ([0-9.e+-]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), line), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  return losses;
}

// The checksum each rank printed: "rank R of W: weights sum S, sum of squares Q".
std::vector<std::string> checksums(const std::string& output, int world) {
  std::vector<std::string> sums;
  for (int rank = 0; rank < world; ++rank) {
    std::regex line("rank " + std::to_string(rank) + " of " + std::to_string(world) + ": (weights sum [^\n]*)");
    std::smatch match;
    if (std::regex_search(output, match, line)) sums.push_back(match[1]);
  }
  return sums;
}

// The "largest difference from the model without ...: D" a program printed;
// -1 when it printed none.
double reported_difference(const std::string& output) {
  std::smatch match;
  if (!std::regex_search(output, match, std::regex("largest difference from the model without [^:]*: ([0-9.e+-]+)"))) {
    return -1;
  }
  return std::stod(match[1]);
}

std::vector<torch::Tensor> load_weights(const std::string& path) {
  std::vector<torch::Tensor> weights;
  torch::load(weights, path);
  return weights;
}

TEST(InstallTest, TheExamplesBuildAgainstTheInstallAndTrainAsTheirReferences) {
  TempDir dir;
  const std::string prefix = dir.file("prefix"), build = dir.file("build");

  auto installed = run(std::string("'") + TANDEM_CMAKE + "' --install '" + TANDEM_BINARY_DIR + "' --prefix " + prefix);
  ASSERT_EQ(installed.exit_code, 0) << installed.output;
  for (const char* file : {"bin/tandem", "include/tandem/tandem.h", "include/tandem/parallel/ddp.h",
                           "lib/libtandem_parallel.a", "lib/cmake/tandem/tandemConfig.cmake",
                           "lib/cmake/tandem/tandemConfigVersion.cmake"}) {
    EXPECT_TRUE(std::filesystem::exists(prefix + "/" + file)) << file << " was not installed";
  }

  // One version everywhere: tandem/version.h's.
  auto version = run(prefix + "/bin/tandem version");
  EXPECT_EQ(version.output, std::string("tandem ") + TANDEM_VERSION + "\n");
  EXPECT_NE(testing::read_text(prefix + "/lib/cmake/tandem/tandemConfigVersion.cmake")
                .find("PACKAGE_VERSION \"" TANDEM_VERSION "\""),
            std::string::npos);

  // The install and this tree's own prefix path (torch, and Debian's
  // packages where they were unpacked), never this build tree. The
  // examples compile without optimisation, as the tests' own code does
  // (Note [tests compile without optimisation]): 66 s for this test
  // against 81 s at the examples' default -O3.
  std::string configure = std::string("CMAKE_PREFIX_PATH='") + prefix + ":" + TANDEM_PREFIX_PATH + "' '" +
                          TANDEM_CMAKE + "' -S '" + TANDEM_SOURCE_DIR + "/examples' -B " + build + " -G '" +
                          TANDEM_GENERATOR + "' '-DTorch_DIR=" + TANDEM_TORCH_DIR + "' '-DCMAKE_CXX_COMPILER=" +
                          TANDEM_CXX_COMPILER + "' '-DCMAKE_CXX_FLAGS=" + TANDEM_CXX_FLAGS +
                          "' -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-O0";
  if (std::string(TANDEM_CUDA_COMPILER).size() > 0) {
    configure += std::string(" '-DCMAKE_CUDA_COMPILER=") + TANDEM_CUDA_COMPILER + "'";
  }
  auto configured = run(configure);
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  auto built = run(std::string("'") + TANDEM_CMAKE + "' --build " + build);
  ASSERT_EQ(built.exit_code, 0) << built.output;
  const std::string example = build + "/ddp";

  auto alone = run(example + " --weights-out " + dir.file("one.pt"));
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  auto losses = epoch_losses(alone.output);
  ASSERT_EQ(losses.size(), 8u) << alone.output;
  EXPECT_LT(losses.back(), losses.front() / 4) << "the example did not learn:\n" << alone.output;
  EXPECT_EQ(checksums(alone.output, 1).size(), 1u) << alone.output;

  auto two = run(prefix + "/bin/tandem launch --nproc-per-node 2 -- " + example + " --weights-out " +
                 dir.file("two.pt"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  auto sums = checksums(two.output, 2);
  ASSERT_EQ(sums.size(), 2u) << two.output;
  EXPECT_EQ(sums[0], sums[1]) << "the ranks ended with different weights:\n" << two.output;
  // The same global batch over 2 ranks: the same weights as one process.
  auto one_weights = load_weights(dir.file("one.pt")), two_weights = load_weights(dir.file("two.pt"));
  ASSERT_EQ(one_weights.size(), two_weights.size());
  for (size_t k = 0; k < one_weights.size(); ++k) {
    auto scale = one_weights[k].abs().max().item<double>();
    auto diff = (one_weights[k] - two_weights[k]).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale) << "parameter " << k;
  }

  // A mistake in the program's own flags ends both ranks, and the launcher
  // names one.
  auto refused = run(prefix + "/bin/tandem launch --nproc-per-node 2 -- " + example + " --global-batch 63");
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_NE(refused.output.find("--global-batch 63 is not a multiple of the 2 processes"), std::string::npos)
      << refused.output;
  EXPECT_NE(refused.output.find("exited with code 2"), std::string::npos) << refused.output;

  // DataParallel over a repeated device, and a pipeline of 3 stages under
  // each schedule: each program trains a copy without them beside and
  // fails above a relative 1e-5.
  for (const std::string& command : {std::string("/data_parallel --devices cpu,cpu,cpu"),
                                     std::string("/pipeline --devices cpu,cpu,cpu --schedule gpipe --micro-batches 8"),
                                     std::string("/pipeline --devices cpu,cpu --schedule 1f1b --micro-batches 4")}) {
    auto r = run(build + command);
    EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
    auto losses = epoch_losses(r.output);
    ASSERT_EQ(losses.size(), 4u) << command << "\n" << r.output;
    EXPECT_LT(losses.back(), losses.front() / 4) << command << "\n" << r.output;
    double difference = reported_difference(r.output);
    EXPECT_GE(difference, 0) << command << "\n" << r.output;
    EXPECT_LE(difference, 1e-5) << command << "\n" << r.output;
  }

  // Seed 004: the program starts its own 2 workers, which average their
  // gradients by hand and end alike; a worker's mistake ends both.
  auto by_hand = run(build + "/average_gradients --processes 2");
  ASSERT_EQ(by_hand.exit_code, 0) << by_hand.output;
  auto by_hand_sums = checksums(by_hand.output, 2);
  ASSERT_EQ(by_hand_sums.size(), 2u) << by_hand.output;
  EXPECT_EQ(by_hand_sums[0], by_hand_sums[1]) << by_hand.output;
  auto by_hand_losses = epoch_losses(by_hand.output);
  ASSERT_EQ(by_hand_losses.size(), 8u) << by_hand.output;
  EXPECT_LT(by_hand_losses.back(), by_hand_losses.front() / 4) << by_hand.output;
  auto too_big = run(build + "/average_gradients --processes 2 --batch 600");
  EXPECT_EQ(too_big.exit_code, 2) << too_big.output;  // every worker's usage error is the launcher's
  EXPECT_NE(too_big.output.find("average_gradients: rank "), std::string::npos) << too_big.output;
  EXPECT_NE(too_big.output.find("exited with code 2"), std::string::npos) << too_big.output;
  EXPECT_NE(too_big.output.find("--batch 600 is more than a worker's part of 512 samples"), std::string::npos)
      << too_big.output;
}

}  // namespace
}  // namespace tandem
