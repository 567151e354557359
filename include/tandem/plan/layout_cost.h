// tandem/plan/layout_cost.h: what one layout of a training job costs each
// rank: memory, bytes per step over each mesh dimension, the pipeline's
// bubble, and the step's time, tokens/s and MFU on a device profile.
//
// Note [planned traffic]: the bytes are the payloads tandem's process
// groups count (Note [traffic] in dist/process_group.h), per step, on the
// rank that sends the most, so that a run's --metrics-out
// comm_bytes_per_step is the check: DDP's all-reduce of the rank's
// gradients plus an int32 used flag a tensor; ZeRO-1's broadcast of its
// parameters; FSDP's reduce-scatter of the gradients and all-gather of the
// shards (twice with ZeRO-3 but for the last unit, a layer a unit); tp's
// 4 all-reduces a layer and micro-batch of its activations, one for the
// embedding, one for the head's input gradient and the vocabulary-parallel
// loss's 4 numbers a token (Megatron-LM's figure; all-gathers and
// reduce-scatters under sequence parallelism); a pipeline's activation
// and gradient a boundary and micro-batch, each after an 80-byte header,
// and the loss's 8-byte broadcast; cp's ring, per attention layer and
// micro-batch, 2 (C - 1) blocks of keys and values forward (again when
// recomputed) and 4 (C - 1) + 2 backward (the blocks with their gradients'
// running sums, and the sums' hop home), a block a rank's tokens' key/value
// heads; ep's all-to-alls, per mixture layer and micro-batch, forward and
// backward, the rows of a rank's (token, expert) pairs whose expert is
// elsewhere and as many served for others, with one int64 count per expert
// held elsewhere (a uniform routing's figure: a run's routing moves it, by
// 5-8% on the tiny models), DDP's all-reduce with the experts kept out, and
// ep_replicate's all-reduce of the experts' gradients. On the wire a ring
// moves 2(n-1)/n of an all-reduce's payload, (n-1)/n of a reduce-scatter's,
// n-1 times an all-gather's: the time uses those.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "tandem/plan/device_profile.h"
#include "tandem/plan/model_shape.h"

namespace tandem::plan {

enum class Precision { kBf16, kFloat32, kFloat64 };  // bf16: autocast over float32 weights
enum class DataSharding { kDdp, kZero1, kFsdp, kHsdp };
enum class OptimizerKind { kAdamW, kSgdMomentum, kSgd };  // state tensors a parameter: 2, 1, 0

struct Job {
  ModelShape model;
  DeviceProfile device;
  int64_t nodes = 1, gpus_per_node = 8;
  int64_t seq_len = 2048;
  int64_t global_batch = 0;  // sequences a step
  Precision precision = Precision::kBf16;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  int64_t world() const { return nodes * gpus_per_node; }
};

struct Layout {
  int64_t dp = 1, pp = 1, tp = 1;
  // Context parallelism: each sequence cut over cp ranks (ring attention,
  // Note [context parallelism]); the data dimension's dp x cp ranks reduce
  // the gradients together and FSDP shards over them.
  int64_t cp = 1;
  // Expert parallelism: a mixture's experts spread over ep ranks borrowed
  // from the data dimension's dp x cp (Note [expert dispatch]); each rank
  // holds 1 / ep of them, and the ranks holding the same ones (the group
  // ep_replicate) sum their gradients. Under DDP only, as tandem train.
  int64_t ep = 1;
  bool sequence_parallel = false;
  DataSharding data = DataSharding::kDdp;
  int64_t dp_shard = 0;  // HSDP: dp ranks a shard group holds (a node's); it shards over dp_shard x cp
  bool recompute = false;  // activation checkpointing, every layer
  int64_t micro_batch = 1;  // sequences a micro-batch
  int64_t micro_batches = 1;  // per step: a pipeline's, or gradient accumulation's
  std::string schedule = "1f1b";
  int64_t fsdp_min_unit = int64_t(1) << 17;  // --fsdp-min-unit-params
  bool fsdp_reshard = true;  // ZeRO-3 (--fsdp-sharding full); false: ZeRO-2, each unit gathered once
  bool allreduce = false;    // --strategy allreduce: the gradients all-reduced without DDP's used flags
  // "dp=8", "pp=2,dp=4,cp=2,tp=2", "dp=4,ep=2", "dp_replicate=2,dp_shard=8": --mesh's words.
  std::string mesh() const;
  // "ddp", "zero1", "fsdp", "hsdp".
  std::string strategy() const;
};

struct Memory {
  double parameters = 0, gradients = 0, optimizer = 0, activations = 0, buffers = 0;
  double total() const { return parameters + gradients + optimizer + activations + buffers; }
};

struct LayoutCost {
  Layout layout;
  Memory memory;  // the rank with the most (a pipeline's first stage, or its last with the head)
  std::vector<Memory> stage_memory;  // each pipeline stage's ranks' (rank 0 holds stage 0)
  bool fits = false;
  double shortfall = 0;  // bytes over the device's memory, when it does not fit
  // dimension ("dp", "pp", "tp") -> collective -> bytes a step (Note [planned traffic])
  std::map<std::string, std::map<std::string, double>> bytes;
  // The same for each pipeline stage's ranks (rank 0 holds stage 0).
  std::vector<std::map<std::string, std::map<std::string, double>>> stage_bytes;
  double bubble = 0;  // the schedule's idle share, replayed (parallel::simulate)
  double compute_seconds = 0, exposed_comm_seconds = 0, bubble_seconds = 0, step_seconds = 0;
  double tokens_per_second = 0;  // the whole job's
  double mfu = 0;
};

// `layout`'s cost for `job`. Throws tandem::Error for a layout whose sizes
// do not divide the job (checked by the planner before).
LayoutCost layout_cost(const Job& job, const Layout& layout);

}  // namespace tandem::plan
