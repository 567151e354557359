// While it lives, libtorch computes on one thread (a core's share of a
// node's ranks, as the planner's CPU profile counts them); the count it
// had before comes back after.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include <torch/torch.h>

namespace tandem::plan::internal {

class OneThread {
 public:
  OneThread() : threads_(torch::get_num_threads()) { torch::set_num_threads(1); }
  ~OneThread() { torch::set_num_threads(threads_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int threads_;
};

// Note [calibrated under load] (calibrate.cpp): `time(c)` on each of
// `cores` threads at once, core c's timings returned one after another;
// a thread's exception is rethrown here after all have joined.
inline std::vector<double> on_every_core(int64_t cores, const std::function<std::vector<double>(int64_t)>& time) {
  std::vector<std::vector<double>> times(static_cast<size_t>(cores));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(cores));
  std::vector<std::thread> threads;
  for (int64_t c = 0; c < cores; ++c) {
    threads.emplace_back([&, c] {
      try {
        times[static_cast<size_t>(c)] = time(c);
      } catch (...) {
        errors[static_cast<size_t>(c)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  std::vector<double> all;
  for (const auto& t : times) all.insert(all.end(), t.begin(), t.end());
  return all;
}

}  // namespace tandem::plan::internal
