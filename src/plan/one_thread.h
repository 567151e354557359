// While it lives, libtorch computes on one thread (a core's share of a
// node's ranks, as the planner's CPU profile counts them); the count it
// had before comes back after.
#pragma once

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

}  // namespace tandem::plan::internal
