// task_thread.h (private to src/parallel): a thread kept for its owner's
// lifetime that runs one task at a time. Pipeline stages and DataParallel's
// replicas run on these rather than on a new thread per step: a new thread
// starts with cold thread-local state, and some of it is costly to rebuild
// (cuDNN's execution plans are cached per thread, Note [kept threads] in
// data_parallel.h).
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include <c10/core/Device.h>
#include <c10/core/Stream.h>

namespace tandem::parallel::detail {

class TaskThread {
 public:
  TaskThread();
  ~TaskThread();  // waits for a running task, then joins
  TaskThread(const TaskThread&) = delete;
  TaskThread& operator=(const TaskThread&) = delete;

  // Runs `task` on the thread (after at::init_num_threads(), Note [intra-op
  // settings of new threads] in pipeline.h). `task` must not throw; one
  // task at a time: wait() before the next start().
  void start(std::function<void()> task);
  void wait();

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::function<void()> task_;
  bool busy_ = false, stop_ = false;
  std::thread thread_;  // last: starts after the members above exist
};

// The calling thread's current stream on `device`, for work handed to
// another thread to run on (under c10::OptionalStreamGuard), as the caller
// would have; none for the CPU.
std::optional<c10::Stream> current_stream(const c10::Device& device);

}  // namespace tandem::parallel::detail
