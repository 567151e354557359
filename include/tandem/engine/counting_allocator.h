// tandem/engine/counting_allocator.h: a CPU allocator that counts the bytes
// live and their peak (header-only; c10 alone): for measuring what a step
// holds (Note [worker footprint]), and for the tests and the benchmarks.
//
//   tandem::engine::CountingCpuAllocator counting;  // installed for its scope
//   ... counting->reset_peak(); work; counting->peak() ...
//
// Process-wide: threads (rank threads) add up.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>

namespace tandem::engine {

// One at a time: the deleter finds it through a static pointer, so that
// each DataPtr's context is its data (what c10's raw_allocate, used by some
// kernels for scratch space, asserts).
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) { current() = this; }
  ~CountingAllocator() override { current() = nullptr; }
  c10::DataPtr allocate(size_t n) override {
    auto inner = base_->allocate(n);
    void* data = inner.get();
    auto device = inner.device();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_.emplace(data, Block{std::move(inner), n});
    }
    live_ += static_cast<int64_t>(n);
    int64_t now = live_, peak = peak_;
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &free_block, device};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_block; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
  void reset_peak() { peak_ = live_.load(); }
  // The one installed now (null when none is).
  static CountingAllocator* installed() { return current(); }
  int64_t live() const { return live_; }
  int64_t peak() const { return peak_; }

 private:
  struct Block {
    c10::DataPtr data;
    size_t bytes;
  };
  static CountingAllocator*& current() {
    static CountingAllocator* instance = nullptr;
    return instance;
  }
  static void free_block(void* data) {
    auto* self = current();
    if (self == nullptr) return;  // freed after the counter went: leaked, never double-freed
    c10::DataPtr inner;
    {
      std::lock_guard<std::mutex> lock(self->mutex_);
      auto found = self->blocks_.find(data);
      if (found == self->blocks_.end()) return;
      inner = std::move(found->second.data);
      self->live_ -= static_cast<int64_t>(found->second.bytes);
      self->blocks_.erase(found);
    }
  }
  c10::Allocator* base_;
  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  std::atomic<int64_t> live_{0}, peak_{0};
};

// The CPU allocator counting for this object's life (tensors made now are
// counted, freed ones too), the one before restored at its end, also when
// an exception leaves the scope early.
class CountingCpuAllocator {
 public:
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()), counting_(base_) {
    c10::SetCPUAllocator(&counting_, /*priority=*/100);
  }
  ~CountingCpuAllocator() { c10::SetCPUAllocator(base_, /*priority=*/100); }
  CountingCpuAllocator(const CountingCpuAllocator&) = delete;
  CountingCpuAllocator& operator=(const CountingCpuAllocator&) = delete;
  CountingAllocator* operator->() { return &counting_; }
  CountingAllocator& counting() { return counting_; }

 private:
  c10::Allocator* base_;
  CountingAllocator counting_;
};

}  // namespace tandem::engine
