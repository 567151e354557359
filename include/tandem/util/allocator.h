// tandem/util/allocator.h: glibc malloc settings for training processes.
//
// Note [malloc for training]: a CPU training step allocates and frees the
// same few large activation buffers (tens of MB) every step. With glibc's
// defaults, blocks above the mmap threshold are mmap'd and unmapped each time,
// and freed heap tops are trimmed back to the kernel, so every step faults in
// and zeroes fresh pages (~25,000 page faults a step for convnet at batch 256,
// 5-10% of the step). Raising the mmap threshold to glibc's maximum (32 MiB on
// 64-bit) and keeping freed memory in the process makes steady-state steps
// fault-free. PyTorch in Python runs with glibc's defaults; the measured
// effect is in docs/PERFORMANCE.md and bench/results/cpu_train.md.
#pragma once

namespace tandem {

// Applies the settings above, once per process, unless the user has set any
// of glibc's MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or MALLOC_TOP_PAD_
// (theirs win) or TANDEM_DEFAULT_MALLOC=1. Call from main() before work starts.
void tune_malloc_for_training();

}  // namespace tandem
