// tandem/engine/parallel_layout.h: how a run's processes are laid out,
// decided once from the flags: the device mesh (pp x dp, dist/device_mesh.h),
// whether the model runs as a pipeline, and how the data-parallel dimension
// is done.
//
// --mesh gives the mesh; without it the strategy's shorthand does: a
// pipeline over N ranks (--strategy pipeline --nproc-per-node N) is pp=N,
// anything else dp=N. --strategy ddp, allreduce or fsdp says how the dp
// dimension is done whatever the mesh; with --strategy pipeline (or auto) it
// is DDP.
//
// Note [replicated stages]: with pp > 1 and dp > 1 every pipeline stage is
// replicated over its dp group. Each replica pipeline reads its own
// DistributedSampler share of the global batch (the sampler's world is the
// dp size, its rank the dp coordinate), cuts it into --micro-batches, and
// the stage's gradients are averaged over the dp group after the last
// micro-batch's backward. Because the dp ranks' k-th micro-batches together
// are the one-process pipeline's k-th micro-batch, and every micro-batch's
// loss is weighted by its share of the batch, the averaged gradient is one
// process's on the global batch: the composition trains the same weights to
// rounding (tests/cli/mesh_cli_test.cpp, float64).
#pragma once

#include <cstdint>
#include <string>

#include "tandem/dist/device_mesh.h"
#include "tandem/engine/train_options.h"

namespace tandem::engine {

// How the dp dimension is done.
enum class DataParallelism { kNone, kDdp, kAllReduce, kFsdp };

struct ParallelLayout {
  dist::MeshShape mesh;  // over the job's ranks (all 1 for one process)
  // The model runs as a pipeline: over the pp ranks (mesh pp > 1) or over
  // --devices in one process.
  bool pipeline = false;
  DataParallelism data = DataParallelism::kDdp;
  int64_t pipeline_ranks() const { return mesh[dist::MeshDim::kPipeline]; }
  int64_t data_ranks() const { return mesh[dist::MeshDim::kData]; }
  int64_t tensor_ranks() const { return mesh[dist::MeshDim::kTensor]; }
  // Context parallelism: the data dimension's ranks that read the same
  // samples (data_ranks() counts them all; the samples are read by
  // data_ranks() / context_ranks() replicas).
  int64_t context_ranks() const { return mesh.cp; }
  // Whether the run's ranks are a mesh whose groups must be split:
  // replicated stages, tp, or cp.
  bool split_mesh() const { return replicated_stages() || tensor_ranks() > 1 || context_ranks() > 1; }
  // Both dimensions over ranks (Note [replicated stages]).
  bool replicated_stages() const { return pipeline_ranks() > 1 && data_ranks() > 1; }
  // A pipeline over the mesh's pp ranks whose stages are replicated over
  // dp or split over tp ranks, or both.
  bool staged_mesh() const { return pipeline_ranks() > 1 && (data_ranks() > 1 || tensor_ranks() > 1); }
};

// The layout of a job of `ranks` processes (1: one process). Throws
// tandem::UsageError naming --mesh or --strategy for a mesh the job cannot
// have.
ParallelLayout parallel_layout(const TrainOptions& options, int64_t ranks);

// Context parallelism over `cp` ranks cuts each sequence into 2 cp equal
// chunks: throws tandem::UsageError naming --seq-len and --mesh (`mesh`:
// its text) for sequences of `seq_len` tokens it does not divide (0: the
// model's context, checked once the data are open).
void check_context_seq_len(int64_t seq_len, int64_t cp, const std::string& mesh);

// Whether the model runs as a pipeline, from the flags alone: --strategy
// pipeline, or a --mesh with pp > 1.
bool pipelined(const ParallelSection& options);

}  // namespace tandem::engine
