#include <thread>
#include "testing.h"

#include <dlfcn.h>
#include <sys/wait.h>
#include <zlib.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>
#include <stdexcept>

#include <gtest/gtest.h>

#include "tandem/data/image_io.h"
#include "tandem/util/check.h"

namespace tandem::testing {

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_idx(const std::string& path, const torch::Tensor& data, bool gzip) {
  auto bytes = data.to(torch::kUInt8).contiguous();
  std::string out;
  out.push_back(0);
  out.push_back(0);
  out.push_back(0x08);
  out.push_back(static_cast<char>(bytes.dim()));
  for (auto size : bytes.sizes()) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((size >> shift) & 0xff));
  }
  out.append(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), bytes.numel());
  if (gzip) {
    gzFile file = gzopen(path.c_str(), "wb");
    gzwrite(file, out.data(), static_cast<unsigned>(out.size()));
    gzclose(file);
  } else {
    std::ofstream(path, std::ios::binary).write(out.data(), static_cast<std::streamsize>(out.size()));
  }
}

torch::Tensor write_synthetic_idx(const std::string& dir, int64_t train_count,
                                  int64_t test_count, bool gzip) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
  auto make = [&](int64_t n, const std::string& prefix) {
    auto labels = torch::randint(0, 10, {n}, generator, torch::kInt64);
    auto images = torch::randint(0, 90, {n, 28, 28}, generator, torch::kInt64);
    for (int64_t i = 0; i < n; ++i) {
      int64_t k = labels[i].item<int64_t>();
      images[i].slice(0, 2 * k + 3, 2 * k + 5).add_(150);
    }
    std::string ext = gzip ? ".gz" : "";
    write_idx(dir + "/" + prefix + "-images-idx3-ubyte" + ext, images, gzip);
    write_idx(dir + "/" + prefix + "-labels-idx1-ubyte" + ext, labels, gzip);
    return images.to(torch::kUInt8);
  };
  auto train = make(train_count, "train");
  make(test_count, "t10k");
  return train;
}

namespace {
// Ten colours far apart in RGB.
const int kPalette[10][3] = {{220, 30, 30},  {30, 200, 40},  {40, 60, 220}, {230, 220, 40},
                             {210, 40, 200}, {40, 210, 220}, {235, 235, 235}, {50, 50, 50},
                             {240, 140, 20}, {120, 40, 160}};

torch::Tensor coloured(int64_t label, int64_t height, int64_t width, at::Generator& generator) {
  auto noise = torch::randint(-30, 31, {3, height, width}, generator, torch::kInt64);
  auto colour = torch::tensor({kPalette[label % 10][0], kPalette[label % 10][1],
                               kPalette[label % 10][2]},
                              torch::kInt64)
                    .view({3, 1, 1});
  return (colour + noise).clamp(0, 255).to(torch::kUInt8);
}
}  // namespace

ImagesAndLabels write_synthetic_cifar(const std::string& dir, int64_t train_per_batch,
                                      int64_t test_count) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(4321);
  std::filesystem::create_directories(dir);
  auto write = [&](const std::string& name, int64_t n) {
    auto labels = torch::randint(0, 10, {n}, generator, torch::kInt64);
    std::vector<torch::Tensor> images;
    std::ofstream out(dir + "/" + name, std::ios::binary);
    for (int64_t i = 0; i < n; ++i) {
      auto image = coloured(labels[i].item<int64_t>(), 32, 32, generator).contiguous();
      images.push_back(image);
      char label = static_cast<char>(labels[i].item<int64_t>());
      out.write(&label, 1);
      out.write(reinterpret_cast<const char*>(image.data_ptr<uint8_t>()), 3072);
    }
    return ImagesAndLabels{torch::stack(images), labels};
  };
  std::vector<torch::Tensor> images, labels;
  for (int b = 1; b <= 5; ++b) {
    auto part = write("data_batch_" + std::to_string(b) + ".bin", train_per_batch);
    images.push_back(part.images);
    labels.push_back(part.labels);
  }
  write("test_batch.bin", test_count);
  return {torch::cat(images), torch::cat(labels)};
}

void write_synthetic_image_folder(const std::string& dir, int64_t classes, int64_t per_class,
                                  int64_t size) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(99);
  for (int64_t c = 0; c < classes; ++c) {
    std::string folder = dir + "/c" + std::to_string(c);
    std::filesystem::create_directories(folder);
    for (int64_t i = 0; i < per_class; ++i) {
      int64_t h = size + (i * 3) % 9, w = size + (i * 5) % 9;
      auto image = coloured(c, h, w, generator);
      char name[32];
      std::snprintf(name, sizeof name, "/img%03d", static_cast<int>(i));
      if (i % 2 == 0) {
        data::write_jpeg(folder + name + ".jpg", image, 92);
      } else {
        data::write_png(folder + name + ".png", image);
      }
    }
  }
}

CommandResult run(const std::string& command_line) {
  CommandResult result;
  FILE* pipe = popen((command_line + " 2>&1").c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed");
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) result.output.append(buffer, n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

CommandResult run_tandem(const std::string& args) {
  return run(std::string(TANDEM_CLI) + " " + args);
}

int worker_pid(const std::string& marker, int rank) {
  auto pids = run("pgrep -f -- '^[^ ]*tandem train .*" + marker + "' || true").output;
  std::istringstream lines(pids);
  std::string pid;
  std::string wanted = std::string(1, '\0') + "RANK=" + std::to_string(rank) + std::string(1, '\0');
  while (std::getline(lines, pid)) {
    // NUL-separated NAME=VALUE entries; LOCAL_RANK=1 must not count.
    std::string environ = std::string(1, '\0') + read_text("/proc/" + pid + "/environ");
    if (environ.find(wanted) != std::string::npos) return std::atoi(pid.c_str());
  }
  return 0;
}

int finished_checkpoints(const std::string& dir) {
  static const std::regex finished("checkpoint-[0-9]+(\\.pt)?");
  int count = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (std::regex_match(it->path().filename().string(), finished)) ++count;
  }
  return count;
}

::testing::AssertionResult tandem_fails(const std::string& args, int exit_code, const std::string& message) {
  auto r = run_tandem(args);
  const bool code_ok = exit_code == kAnyFailure ? r.exit_code != 0 : r.exit_code == exit_code;
  if (code_ok && r.output.find(message) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "tandem " << args << "\n  exit code " << r.exit_code << ", expected "
         << (exit_code == kAnyFailure ? "non-zero" : std::to_string(exit_code))
         << "\n  expected in the output: " << message << "\n  output:\n"
         << r.output;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

nlohmann::json last_metrics(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  return last.empty() ? nlohmann::json() : nlohmann::json::parse(last);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no tandem::Error";
  return "";
}

void copy_parameters(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.parameters();
  auto dst = to.parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].copy_(src[i]);
}

ThreadTeam this_threads_team() {
  using GetThreads = int (*)();
  static auto omp = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "omp_get_max_threads"));
  static auto mkl = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "MKL_Get_Max_Threads"));
  EXPECT_NE(omp, nullptr) << "libtorch without OpenMP: omp_get_max_threads not found";
  EXPECT_NE(mkl, nullptr) << "libtorch without MKL: MKL_Get_Max_Threads not found";
  ThreadTeam team;
  if (omp != nullptr) team.omp = omp();
  if (mkl != nullptr) team.mkl = mkl();
  return team;
}

int thread_serial() {
  static std::atomic<int> next{0};
  thread_local const int mine = next++;
  return mine;
}

torch::Tensor ThreadProbeImpl::forward(torch::Tensor x) {
  const ThreadTeam team = this_threads_team();  // before ATen looks at this thread
  std::optional<std::shared_future<void>> gate;
  {
    std::lock_guard<std::mutex> hold(shared->lock);
    shared->seen.push_back(
        {thread_serial(), team, c10::impl::VirtualGuardImpl(x.device().type()).getStream(x.device())});
    gate = shared->gate;
    if (gate && !shared->announced) {
      shared->announced = true;
      shared->entered.set_value();
    }
  }
  if (gate) gate->wait();
  return x;
}

std::vector<ThreadProbeImpl::Seen> ThreadProbeImpl::seen() const {
  std::lock_guard<std::mutex> hold(shared->lock);
  return shared->seen;
}

UnusualThreadCount::UnusualThreadCount() : old_(at::get_num_threads()) {
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  int from_env = 0;
  if (const char* v = std::getenv("OMP_NUM_THREADS")) from_env = std::atoi(v);
  count_ = std::max({cores, from_env, old_}) + 1;
  at::set_num_threads(count_);
}

UnusualThreadCount::~UnusualThreadCount() { at::set_num_threads(old_); }

}  // namespace tandem::testing

namespace tandem::testing {

std::vector<std::string> run_ranks(int world, const RankFn& fn, dist::GroupOptions options, int port,
                                   bool null_group_for_one) {
  if (port == 0) port = dist::pick_free_port();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::shared_ptr<dist::ProcessGroup> group;
        if (world > 1 || !null_group_for_one) {
          dist::Rendezvous rv;
          rv.port = port;
          rv.rank = r;
          rv.world_size = world;
          rv.local_rank = r;
          rv.local_world_size = world;
          rv.source = "test";
          group = std::make_shared<dist::ProcessGroup>(rv, options);
        }
        fn(group);
      } catch (const std::exception& e) {
        errors[r] = e.what();
        if (errors[r].empty()) errors[r] = "(empty message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

}  // namespace tandem::testing
