// Shared helpers for tandem's tests: temporary folders, small data sets in
// the real on-disk formats, and running the `tandem` binary.
#pragma once

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include "counting_allocator.h"
#include "tandem/dist/process_group.h"

namespace tandem::testing {

// A fresh folder under the system temp dir, removed with its contents.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes an IDX file of unsigned bytes (gzip-compressed when `gzip`).
void write_idx(const std::string& path, const torch::Tensor& data, bool gzip);

// A learnable 10-class data set in MNIST layout under `dir`: class k is a
// bright band at rows [2k+3, 2k+5) over noise. Returns the images of the
// training split.
torch::Tensor write_synthetic_idx(const std::string& dir, int64_t train_count,
                                  int64_t test_count, bool gzip = false);

// A learnable data set in CIFAR-10's binary layout under `dir`:
// data_batch_1..5.bin with `train_per_batch` records each and test_batch.bin
// with `test_count`. Class k is the k-th of ten distinct colours, with noise.
// Returns the training images [N, 3, 32, 32] uint8 and labels [N] int64, in
// file order.
struct ImagesAndLabels {
  torch::Tensor images, labels;
};
ImagesAndLabels write_synthetic_cifar(const std::string& dir, int64_t train_per_batch,
                                      int64_t test_count);

// An ImageFolder tree under `dir`: class folders c0, c1, ... with `per_class`
// images each, coloured by class as above, alternately JPEG (.jpg) and PNG
// (.png), of sizes varying between `size` and `size` + 8.
void write_synthetic_image_folder(const std::string& dir, int64_t classes, int64_t per_class,
                                  int64_t size);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs a shell command line, capturing its output.
CommandResult run(const std::string& command_line);

// A tmpfs mounted on `dir` with `options` for the test's life (root; these
// machines give it). The test fails, not skips, where the mount fails.
struct TmpfsMount {
  TmpfsMount(const std::string& dir, const std::string& options) : dir(dir) {
    auto mounted = run("mount -t tmpfs -o " + options + " tmpfs " + dir + " 2>&1");
    ok = mounted.exit_code == 0;
    output = mounted.output;
  }
  ~TmpfsMount() {
    if (ok) run("umount " + dir);
  }
  std::string dir, output;
  bool ok = false;
};

// Runs the tandem binary with `args` (a shell-quoted string).
CommandResult run_tandem(const std::string& args);

// The pid of the `tandem train` worker whose command line contains `marker`
// and whose environment has RANK=rank; 0 if there is none (yet).
int worker_pid(const std::string& marker, int rank);

// How many finished checkpoints `dir` holds: checkpoint-<step>.pt files and
// checkpoint-<step> folders, not the .tmp-<pid> ones still being written.
int finished_checkpoints(const std::string& dir);

// Whether `tandem ARGS` exits with `exit_code` (kAnyFailure: any non-zero
// code) and prints `message`; else a failure showing the code and output.
// EXPECT_TRUE(tandem_fails("train --flag x", 2, "--flag")) keeps the
// caller's line in the report.
constexpr int kAnyFailure = -1;
::testing::AssertionResult tandem_fails(const std::string& args, int exit_code, const std::string& message);

// Reads a whole file.
std::string read_text(const std::string& path);

// The last line of a --metrics-out file, parsed; null when there is none.
nlohmann::json last_metrics(const std::string& path);

// Note [a learning check on Fashion-MNIST]: convnet on Fashion-MNIST
// (batch 256, the default lr) reaches 74.6% test accuracy after 40 steps,
// a sixth of an epoch, in 7 s on one process of the 2-core machine
// (chance: 10%; 60.2% after 20 steps); a whole epoch reaches 85% in 47 s.
// The learning checks of each way to run it (processes, DataParallel,
// pipelines) train these steps and hold the accuracy to kLearnedAccuracy;
// that the ways are one arithmetic is proved exactly, in float64, by the
// layout tests.
inline constexpr const char* kLearningSteps = " --epochs 1 --max-steps 40 ";
inline constexpr double kLearnedAccuracy = 0.70;

// Runs fn(group) on `world` ranks, one thread each, joined in a Gloo group
// on 127.0.0.1 (at `port`, or a free one); returns each rank's error message
// ("" when it finished). With `null_group_for_one`, a world of 1 gets a null
// group (the single-process code path) instead of a group of one.
using RankFn = std::function<void(std::shared_ptr<dist::ProcessGroup>)>;
std::vector<std::string> run_ranks(int world, const RankFn& fn, dist::GroupOptions options = {},
                                   int port = 0, bool null_group_for_one = false);

// EXPECTs every message of run_ranks to be empty.
void expect_no_errors(const std::vector<std::string>& errors);

// The message of the tandem::Error that f throws; a test failure if none.
std::string error_of(const std::function<void()>& f);

// Copies `from`'s parameters into `to`'s, in order (the same architecture).
void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to);

// The calling thread's own intra-op settings as OpenMP and MKL hold them
// (omp_get_max_threads, MKL_Get_Max_Threads), read directly, so without the
// lazy per-thread initialisation that ATen's own getters perform; a test
// failure, and -1, where the pinned libtorch lacks either library.
struct ThreadTeam {
  int omp = -1, mkl = -1;
};
ThreadTeam this_threads_team();

// A number per thread, never reused (a joined thread's std::thread::id can
// be a new thread's).
int thread_serial();

// An identity module that records, for each forward, the thread that ran it
// (thread_serial()), that thread's intra-op team (this_threads_team(), read
// before any ATen operation there) and the current stream of its input's
// device; its clones (DataParallel's replicas) record into the same list.
// `gate`, when set, holds every forward until it is opened; `entered` is set
// by the first forward that finds a gate.
struct ThreadProbeImpl : torch::nn::Cloneable<ThreadProbeImpl> {
  struct Seen {
    int thread;
    ThreadTeam team;
    c10::Stream stream;
  };
  struct Shared {
    std::mutex lock;
    std::vector<Seen> seen;
    std::optional<std::shared_future<void>> gate;
    std::promise<void> entered;
    bool announced = false;
  };
  void reset() override {}
  torch::Tensor forward(torch::Tensor x);
  // A copy of what has been seen so far.
  std::vector<Seen> seen() const;
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
};
TORCH_MODULE(ThreadProbe);

// Sets at::set_num_threads to a count that is neither the machine's core
// count nor OMP_NUM_THREADS (so no fresh thread has it by default), and puts
// the old count back on destruction.
class UnusualThreadCount {
 public:
  UnusualThreadCount();
  ~UnusualThreadCount();
  UnusualThreadCount(const UnusualThreadCount&) = delete;
  UnusualThreadCount& operator=(const UnusualThreadCount&) = delete;
  int count() const { return count_; }

 private:
  int old_, count_;
};

}  // namespace tandem::testing
