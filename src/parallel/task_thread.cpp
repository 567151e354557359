#include "task_thread.h"

#include <ATen/Parallel.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace tandem::parallel::detail {

TaskThread::TaskThread() : thread_([this] { loop(); }) {}

TaskThread::~TaskThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void TaskThread::start(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = std::move(task);
    busy_ = true;
  }
  wake_.notify_all();
}

void TaskThread::wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return !busy_; });
}

void TaskThread::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || task_; });
    if (!task_) return;  // stopping, nothing left to run
    auto task = std::move(task_);
    task_ = nullptr;
    lock.unlock();
    at::init_num_threads();  // Note [intra-op settings of new threads] in pipeline.h
    task();
    lock.lock();
    busy_ = false;
    done_.notify_all();
  }
}

std::optional<c10::Stream> current_stream(const c10::Device& device) {
  if (device.is_cpu()) return std::nullopt;
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace tandem::parallel::detail
