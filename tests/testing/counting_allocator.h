// counting_allocator.h: the library's counting CPU allocator
// (tandem/engine/counting_allocator.h), under the tests' namespace, and
// installed for a scope.
#pragma once

#include <c10/core/CPUAllocator.h>

#include "tandem/engine/counting_allocator.h"

namespace tandem::testing {
using engine::CountingAllocator;

// The CPU allocator counting for this object's life (tensors made now are
// counted, freed ones too), the one before restored at its end: also
// when a failed expectation leaves the test early.
class CountingCpuAllocator {
 public:
  CountingCpuAllocator() : base_(c10::GetCPUAllocator()), counting_(base_) {
    c10::SetCPUAllocator(&counting_, /*priority=*/100);
  }
  ~CountingCpuAllocator() { c10::SetCPUAllocator(base_, /*priority=*/100); }
  CountingCpuAllocator(const CountingCpuAllocator&) = delete;
  CountingCpuAllocator& operator=(const CountingCpuAllocator&) = delete;
  CountingAllocator* operator->() { return &counting_; }

 private:
  c10::Allocator* base_;
  CountingAllocator counting_;
};

}  // namespace tandem::testing
