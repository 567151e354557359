// tandem/engine/worker_footprint.h: what N local workers of a training job
// need, measured before they are started, against what the machine has.
//
// Note [worker footprint]: `tandem train --nproc-per-node 64` on a 2-core,
// 23 GB machine started 64 workers that climbed towards the kernel's
// out-of-memory killer with nothing said. Before starting CPU workers, the
// launching process (the same program, libtorch loaded as in a worker)
// measures one worker: its own anonymous memory (/proc/self/status) before
// and after opening the data as a worker does; then, counting every tensor
// libtorch allocates (engine::CountingAllocator), the model with its
// gradients and momentum after an SGD step, and the peak above that of a
// step and of an evaluation forward on up to kProbeBatch samples, the larger,
// scaled to the worker's batch. Against it: the memory the kernel says
// is available (MemAvailable; a cgroup's memory.max when lower) and the
// cores. An estimate: malloc keeps freed memory, and a pipeline stage holds
// part of the model (its estimate is the whole model's). Too little memory
// is refused with the figures; a tight fit, and more CPU workers than
// cores, are warned of.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/engine/train_options.h"
#include "tandem/models/options.h"

namespace tandem::engine {

// The largest batch the probe step takes (its activations are scaled up to
// the worker's batch): small, to keep the probe short.
inline constexpr int64_t kProbeBatch = 4;

struct WorkerFootprint {
  int64_t base_bytes = 0;         // this process before the data: libtorch and the program
  int64_t data_bytes = 0;         // the data set as a worker holds it
  int64_t state_bytes = 0;        // the model, its gradients and momentum after a step
  int64_t activation_bytes = 0;   // the peak above that of a step or an evaluation, at the
                                  // worker's batch
  int64_t worker_batch = 0;       // the samples a worker takes a step
  int64_t probe_batch = 0;        // the samples the probe took
  int64_t total() const { return base_bytes + data_bytes + state_bytes + activation_bytes; }
};

// Measures one worker of a job of `workers` CPU workers (Note [worker
// footprint]). Throws tandem::Error where the data or model cannot be made
// (the same errors a worker would give).
WorkerFootprint measure_worker_footprint(const TrainOptions& options, int64_t workers);

// Caps this process's address space at what it maps now plus the memory
// available, so that running out is an allocation error rather than the
// OOM killer's SIGKILL (Note [memory limit]). For a CPU run, once its data
// are open.
void limit_memory_to_available();

struct MachineResources {
  int64_t available_bytes = 0;  // MemAvailable, or a cgroup's room when that is less
  int64_t cores = 1;
};
MachineResources machine_resources();

// A language model whose weights alone (its parameter count, from its
// shape, at `options`' vocabulary and --dtype) need more than `machine`
// has available, for `workers` local CPU workers (each builds the whole
// model before any parallelism cuts it), is refused before anything is
// built (tandem::UsageError naming --model and the figures): building it
// would meet the kernel's out-of-memory killer.
void check_model_fits(const TrainOptions& options, const models::ModelOptions& model_options, int64_t workers,
                      const MachineResources& machine);

// The verdict on `workers` workers of `footprint` each on `machine`:
// throws tandem::Error with the figures when they cannot fit; returns the
// warnings to print (a tight fit, more CPU workers than cores).
std::vector<std::string> check_worker_resources(int64_t workers, const WorkerFootprint& footprint,
                                                const MachineResources& machine);

}  // namespace tandem::engine
