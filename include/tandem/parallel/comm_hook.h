// tandem/parallel/comm_hook.h: how DistributedDataParallel reduces a bucket.
//
// A communication hook receives one bucket of gradients (a flat tensor that
// the parameters' gradients are views of) and starts its reduction; when the
// returned Work's wait() returns, the bucket must hold the gradient average
// over the group. That is the whole contract, as with PyTorch's
// register_comm_hook, so a hook may compress, quantise or reduce over a
// subgroup.
//
//   allreduce  all-reduce in the gradients' own dtype, then divide (default)
//   fp16       divide by the world size, cast to float16, all-reduce the
//              half-size buffer, cast back (PyTorch's fp16_compress_hook)
//   bf16       the same with bfloat16 (bf16_compress_hook): float32's range,
//              so no overflow, but 8 bits of mantissa
// The compressed hooks halve the bytes on the wire of float32 gradients at
// the cost of rounding each rank's contribution and the sum.
#pragma once

#include <memory>
#include <string>

#include <torch/types.h>

#include "tandem/dist/process_group.h"

namespace tandem::parallel {

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual dist::Work reduce(dist::ProcessGroup& group, torch::Tensor bucket) = 0;
};

// "allreduce", "fp16" or "bf16"; anything else is a tandem::Error naming the
// choices.
std::shared_ptr<CommHook> make_comm_hook(const std::string& name);

}  // namespace tandem::parallel
