// counting_allocator.h: the library's counting CPU allocator
// (tandem/engine/counting_allocator.h), under the tests' namespace, and
// installed for a scope.
#pragma once

#include "tandem/engine/counting_allocator.h"

namespace tandem::testing {
using engine::CountingAllocator;

using engine::CountingCpuAllocator;  // installed for a scope

}  // namespace tandem::testing
