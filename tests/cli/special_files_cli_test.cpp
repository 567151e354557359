// Paths that are not what they must be (Note [special files] in
// tandem/util/file.h): FIFOs, folders and devices among the data, the
// inputs and the outputs, and names that hold control characters. Each
// run is bounded by timeout(1): a hang fails the test instead of stalling
// the suite.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "testing.h"

namespace tandem {
namespace {

using testing::TempDir;

// `tandem ARGS` under a time limit of 60 s (exit 124 when it hangs).
testing::CommandResult bounded(const std::string& args) {
  return testing::run("timeout 60 " + std::string(TANDEM_CLI) + " " + args);
}

// The line of `output` that holds `needle`, or "".
std::string line_with(const std::string& output, const std::string& needle) {
  const auto at = output.find(needle);
  if (at == std::string::npos) return "";
  const auto begin = output.rfind('\n', at);
  const auto end = output.find('\n', at);
  return output.substr(begin == std::string::npos ? 0 : begin + 1,
                       end == std::string::npos ? std::string::npos : end - begin - 1);
}

TEST(SpecialFilesCliTest, AFifoAmongImagesIsABadImageNotAHang) {
  TempDir dir;
  testing::write_synthetic_image_folder(dir.path(), 2, 6, 20);
  const std::string fifo = dir.path() + "/c0/waiting.png";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  const std::string args = "train --data imagefolder:" + dir.path() +
                           " --image-size 16 --epochs 1 --batch-size 13 --progress off";
  auto r = bounded(args);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find(fifo + ": is a FIFO; expected an image file"), std::string::npos) << r.output;
  r = bounded(args + " --skip-bad-images");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("waiting.png: is a FIFO"), std::string::npos) << r.output;
}

TEST(SpecialFilesCliTest, DataFilesThatAreNotRegularAreNamed) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  const std::string images = dir.file("t10k-images-idx3-ubyte");
  std::filesystem::remove(images);
  ASSERT_EQ(::mkfifo(images.c_str(), 0666), 0);
  auto r = bounded("train --data idx:" + dir.path() + " --max-steps 1 --progress off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("t10k-images-idx3-ubyte: is a FIFO; expected an IDX file"), std::string::npos)
      << r.output;
  r = bounded("train --data idx:" + images + " --max-steps 1 --progress off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("idx:" + images + ": is a FIFO; expected a folder"), std::string::npos) << r.output;

  // CIFAR's batches, and the weights to start from.
  TempDir cifar;
  testing::write_synthetic_cifar(cifar.path(), 10, 10);
  std::filesystem::remove(cifar.file("test_batch.bin"));
  std::filesystem::create_directory(cifar.file("test_batch.bin"));
  r = bounded("train --data cifar10:" + cifar.path() + " --max-steps 1 --progress off");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("test_batch.bin: is a folder; expected a CIFAR binary batch file"), std::string::npos)
      << r.output;
  TempDir good;
  testing::write_synthetic_idx(good.path(), 64, 16);
  ASSERT_EQ(::mkfifo(good.file("fifo.safetensors").c_str(), 0666), 0);
  for (const std::string& weights : {good.file("fifo.safetensors"), good.path()}) {
    r = bounded("train --data idx:" + good.path() + " --max-steps 1 --progress off --init-weights " + weights);
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_NE(r.output.find(weights + ": is " + (weights == good.path() ? "a folder" : "a FIFO") +
                            "; expected a safetensors file"),
              std::string::npos)
        << r.output;
  }
}

TEST(SpecialFilesCliTest, MetricsOutNamingAFifoWithoutReaderIsRefused) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  ASSERT_EQ(::mkfifo(dir.file("fifo").c_str(), 0666), 0);
  auto r = bounded("train --data idx:" + dir.path() + " --max-steps 1 --progress off --metrics-out " +
                   dir.file("fifo"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("--metrics-out " + dir.file("fifo") + ": is a FIFO that nothing reads"),
            std::string::npos)
      << r.output;
  // With a reader it is written to, as a pipe is. The reader is this
  // test, there before the writer (opening to read without a writer does
  // not wait when non-blocking).
  const int reader = ::open(dir.file("fifo").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(reader, 0);
  r = bounded("train --data idx:" + dir.path() + " --max-steps 1 --progress off --metrics-out " + dir.file("fifo"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  char line[512] = {};
  const ssize_t n = ::read(reader, line, sizeof line - 1);
  ::close(reader);
  ASSERT_GT(n, 0);
  EXPECT_EQ(std::string(line).rfind("{\"epoch\":1,\"step\":1", 0), 0u) << line;
}

// /dev/stdout while stdout is redirected to a file: the metrics lines come
// after what was printed before them, which used to be cut away.
TEST(SpecialFilesCliTest, MetricsOutToStdoutAppends) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  auto r = testing::run("(echo before; timeout 60 " + std::string(TANDEM_CLI) + " train --data idx:" +
                        dir.path() + " --max-steps 1 --progress off --metrics-out /dev/stdout) > " +
                        dir.file("out") + " 2>&1");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  const std::string out = testing::read_text(dir.file("out"));
  EXPECT_EQ(out.rfind("before\n", 0), 0u) << out;
  EXPECT_NE(out.find("{\"epoch\":1,\"step\":1"), std::string::npos) << out;
  EXPECT_NE(out.find("test accuracy"), std::string::npos) << out;  // the summary, after the line
}

// A name that holds a newline or another control character is escaped:
// every message stays one line.
TEST(SpecialFilesCliTest, NamesWithControlCharactersStayOnOneLine) {
  TempDir dir;
  testing::write_synthetic_idx(dir.path(), 64, 16);
  const std::string odd = dir.file("a\nb\tc");
  for (const std::string& args :
       {"train --data idx:" + dir.path() + " --max-steps 1 --progress off --init-weights '" + odd + "'",
        "train --data 'idx:" + odd + "' --max-steps 1 --progress off",
        "train --data idx:" + dir.path() + " --max-steps 1 --progress off --metrics-out '" + odd + "/m.jsonl'",
        "eval --weights '" + odd + "' --data idx:" + dir.path()}) {
    auto r = bounded(args);
    EXPECT_NE(r.exit_code, 0) << r.output;
    const std::string line = line_with(r.output, "tandem: error:");
    EXPECT_NE(line.find(dir.file("a\\nb\\tc")), std::string::npos) << args << "\n" << r.output;
  }
}

}  // namespace
}  // namespace tandem
