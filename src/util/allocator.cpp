#include "tandem/util/allocator.h"

#include <malloc.h>

#include "tandem/util/env.h"

namespace tandem {

void tune_malloc_for_training() {
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (env::get(name)) return;
  }
  if (env::get("TANDEM_DEFAULT_MALLOC").value_or("") == "1") return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace tandem
