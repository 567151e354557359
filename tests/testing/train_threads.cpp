// Ranks of a `tandem train` command line as threads (train_threads.h).
#include "train_threads.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <thread>

#include "tandem/checkpoint/hf_model.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/cli/commands.h"
#include "tandem/data/loader.h"
#include "tandem/dist/process_group.h"
#include "tandem/dist/rendezvous.h"
#include "tandem/engine/trainer.h"

namespace tandem::testing {

namespace {

std::vector<std::string> words(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// What a Trainer printed on its log, kept in memory.
class MemoryLog {
 public:
  MemoryLog() : file_(open_memstream(&text_, &length_)) {}
  ~MemoryLog() {
    if (file_) std::fclose(file_);
    std::free(text_);
  }
  std::FILE* file() { return file_; }
  std::string take() {
    std::fflush(file_);
    return std::string(text_, length_);
  }

 private:
  char* text_ = nullptr;
  size_t length_ = 0;
  std::FILE* file_;
};

}  // namespace

bool ThreadJob::ok() const {
  for (const auto& e : errors) {
    if (!e.empty()) return false;
  }
  return true;
}

std::string ThreadJob::report() const {
  std::string out;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) out += "rank " + std::to_string(r) + ": " + errors[r] + "\n";
  }
  return out + log;
}

ThreadJob train_in_threads(const std::string& flags) {
  checkpoint::enable_hf_models();  // --model hf:DIR, as the CLI's main
  const auto args = words(flags);
  bool timeout_given = false;
  for (const auto& a : args) timeout_given = timeout_given || a == "--dist-timeout";
  auto options = cli::parse_train_flags(args);
  if (!timeout_given) options.dist_timeout = 60;
  char* end = nullptr;
  const long world = std::strtol(options.nproc_per_node.c_str(), &end, 10);
  if (end == options.nproc_per_node.c_str() || *end != '\0' || world < 0) {
    throw std::runtime_error("train_in_threads: --nproc-per-node " + options.nproc_per_node +
                             ": give a number of ranks");
  }
  ThreadJob job;
  MemoryLog log;
  if (world == 0) {
    job.errors.resize(1);
    try {
      engine::Trainer(options, log.file()).run();
    } catch (const std::exception& e) {
      job.errors[0] = e.what();
    }
    job.log = log.take();
    return job;
  }
  job.errors.resize(static_cast<size_t>(world));
  const int port = dist::pick_free_port();
  std::vector<std::thread> threads;
  for (long r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        data::make_this_thread_serial();  // as a launched CPU worker of a shared machine: one thread each
        dist::Rendezvous rv;
        rv.port = port;
        rv.rank = r;
        rv.world_size = world;
        rv.local_rank = r;
        rv.local_world_size = world;
        rv.source = "threads";
        dist::GroupOptions g;
        g.backend = "gloo";
        g.timeout = std::chrono::milliseconds(static_cast<int64_t>(options.dist_timeout * 1000));
        auto group = std::make_shared<dist::ProcessGroup>(rv, g);
        engine::Trainer(options, r == 0 ? log.file() : nullptr, group).run();
      } catch (const std::exception& e) {
        job.errors[static_cast<size_t>(r)] = e.what()[0] ? e.what() : "(an empty message)";
      }
    });
  }
  for (auto& t : threads) t.join();
  job.log = log.take();
  return job;
}

std::map<std::string, torch::Tensor> read_weights(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : checkpoint::read_safetensors(path).tensors) out.emplace(name, t);
  return out;
}

double worst_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                 const std::map<std::string, torch::Tensor>& b) {
  const double inf = std::numeric_limits<double>::infinity();
  if (a.size() != b.size()) {
    ADD_FAILURE() << "the files hold " << a.size() << " and " << b.size() << " tensors";
    return inf;
  }
  double worst = 0;
  for (const auto& [name, x] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.sizes() != x.sizes()) {
      ADD_FAILURE() << name << ": not in both files, or of other shapes";
      return inf;
    }
    if (!x.is_floating_point()) continue;
    const auto x64 = x.to(torch::kFloat64), y64 = it->second.to(torch::kFloat64);
    const double d = (x64 - y64).norm().item<double>() / (x64.norm().item<double>() + 1e-30);
    worst = std::isnan(d) ? inf : std::max(worst, d);
  }
  return worst;
}

}  // namespace tandem::testing
