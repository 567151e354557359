// tandem/parallel/ddp.h: DistributedDataParallel for any torch::nn module.
//
//   DistributedDataParallel ddp(model, group);
//   for (...) {
//     ddp.before_forward();               // buffers from rank 0
//     loss = loss_fn(model->forward(x));
//     loss.backward();                    // buckets are all-reduced as they fill
//     ddp.after_backward();               // waits; gradients are now averaged
//     optimizer.step();
//   }
//
// At construction every rank's parameter names and shapes are compared
// (a clear error names the first rank that differs), then parameters and
// buffers are broadcast from rank 0, and the gradients are planned into
// buckets (bucket_plan.h).
//
// Note [bucket launch order]: a hook on each parameter's gradient
// accumulator counts the gradients of its bucket; when a bucket is complete
// its gradients are copied into one flat tensor and an asynchronous
// all-reduce (average) starts, while backward goes on with the other layers.
// Buckets are launched strictly in plan order (a complete bucket waits for
// the ones before it), so every rank issues the same collectives in the same
// order even when gradients arrive in a different order. after_backward()
// launches what is left, a parameter without a gradient (unused in this
// step) contributing zeros, waits for each bucket in order and copies the
// averaged values back into the parameters' gradients.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/nn/module.h>

#include "tandem/dist/process_group.h"
#include "tandem/parallel/bucket_plan.h"

namespace torch::autograd {
struct Node;
}

namespace tandem::parallel {

struct DdpOptions {
  BucketOptions buckets;
  bool broadcast_buffers = true;  // before every forward, as PyTorch's default
};

// When each bucket's all-reduce started and finished, and when backward
// ended, for measuring how much communication the backward pass hid.
struct DdpTimeline {
  std::chrono::steady_clock::time_point backward_end;
  std::vector<std::chrono::steady_clock::time_point> launched, finished;
};

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<dist::ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  void before_forward();
  void after_backward();

  // Gradient accumulation: while a NoSync is alive, backward passes only
  // accumulate each rank's gradients (no communication, after_backward()
  // returns at once); the first backward after it all-reduces the sums.
  class NoSync {
   public:
    explicit NoSync(DistributedDataParallel& ddp) : ddp_(ddp) { ddp_.sync_ = false; }
    ~NoSync() { ddp_.sync_ = true; }
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;

   private:
    DistributedDataParallel& ddp_;
  };
  NoSync no_sync() { return NoSync(*this); }

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const DdpTimeline& last_timeline() const { return timeline_; }

  // Called by the gradient hooks (Note [bucket launch order]).
  void gradient_ready(size_t parameter);

 private:
  void launch_in_order();  // requires mutex_
  void launch(size_t bucket);

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<dist::ProcessGroup> group_;
  DdpOptions options_;
  std::vector<torch::Tensor> parameters_;  // those that require gradients
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;            // parameter -> bucket
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<uintptr_t> hook_keys_;

  bool sync_ = true;  // false inside no_sync()
  std::mutex mutex_;  // guards the per-step state below
  std::vector<int64_t> missing_;  // gradients still to come, per bucket
  std::vector<bool> seen_;        // per parameter, this step
  size_t next_launch_ = 0;
  std::vector<torch::Tensor> flat_;
  std::vector<dist::Work> work_;
  DdpTimeline timeline_;
};

}  // namespace tandem::parallel
