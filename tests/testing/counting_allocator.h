// counting_allocator.h: the library's counting CPU allocator
// (tandem/engine/counting_allocator.h), under the tests' namespace.
#pragma once

#include "tandem/engine/counting_allocator.h"

namespace tandem::testing {
using engine::CountingAllocator;
}  // namespace tandem::testing
