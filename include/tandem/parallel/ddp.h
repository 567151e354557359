// tandem/parallel/ddp.h: DistributedDataParallel for any torch::nn module.
//
//   DistributedDataParallel ddp(model, group);
//   for (...) {
//     ddp.zero_grad();                    // zeroes the buckets (gradients are views of them)
//     ddp.before_forward();               // buffers from rank 0
//     loss = loss_fn(model->forward(x));
//     ddp.prepare_for_backward(loss);     // only needed with find_unused_parameters
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
// Note [gradients are bucket views]: each bucket is one flat tensor and each
// parameter's .grad() aliases its slice (with the parameter's strides), so
// backward accumulates straight into the bucket, the all-reduce runs on it
// in place, and the averaged gradient needs no copy back (PyTorch's
// gradient_as_bucket_view=True). The aliases are plain tensors sharing the
// bucket's storage, not autograd views, so libtorch's Optimizer::zero_grad()
// (which detach_()es every gradient) still works. Zero gradients in place to
// keep this free: ddp.zero_grad(), or optimizer.zero_grad(false). The
// optimizer's default zero_grad() sets them to undefined; the next backward
// then makes fresh ones, which the hooks copy into the bucket and replace by
// the aliases again: one copy per step, as without bucket views.
//
// Note [bucket launch order]: a hook on each parameter's gradient
// accumulator counts the gradients of its bucket; when a bucket is complete
// the communication hook (comm_hook.h) starts its reduction, asynchronously,
// while backward goes on with the other layers. Buckets are launched
// strictly in plan order (a complete bucket waits for the ones before it),
// so every rank issues the same collectives in the same order even when
// gradients arrive in a different order. after_backward() launches what is
// left, waits for each bucket in order, and leaves the averages in the
// gradients.
//
// Note [communication stream]: on CUDA, each bucket's reduction runs on a
// side stream of DDP's own, so the hook's own kernels (the division and casts
// of the compressing hooks) and the collective do not queue behind backward's
// kernels. Which stream waits on which event:
//   - at launch (in the autograd thread), an event recorded on that thread's
//     current stream, after the bucket's last gradient, is waited on by the
//     communication stream; the hook then runs with that stream current, and
//     c10d's collective (NCCL's own stream, or Gloo's copies) orders itself
//     after it;
//   - in after_backward(), each Work is waited on with the communication
//     stream current (NCCL: that stream waits, the host does not block), the
//     hook's last steps run there, and one event recorded after them is
//     waited on by the caller's stream: the optimizer reads the averages only
//     after they are complete.
// The buckets live as long as DDP, so no record_stream is needed for them; a
// hook's temporaries are made on the communication stream itself. On the CPU
// there are no streams and none of this applies.
//
// Note [a step ends in after_backward]: the reductions backward started run
// on in the background, writing into the gradients, until after_backward()
// waits for them; an optimizer step before it would read sums half made.
// A step whose buckets went out and that never reached after_backward() is
// therefore refused at the next before_forward(), naming the missing call,
// so a loop that forgets it fails at its second step instead of training
// on wrong gradients. (PyTorch's DDP ends the step itself, with a callback
// at the end of backward; that callback would fire early inside a
// reentrant backward such as activation checkpointing's, so tandem keeps
// the call explicit.)
//
// Note [unused parameters]: a parameter that got no gradient this step
// contributes its current .grad() (zero after zero_grad(), or what no_sync()
// steps accumulated); its bucket is launched at after_backward() at the
// latest, so an unused parameter never hangs the step (PyTorch's DDP stops
// with an error unless find_unused_parameters is set). After backward a
// flag per parameter (had a gradient) is all-reduced with the last buckets
// (a rank waits for it only when one of its parameters had none):
// a parameter used on some rank gets the average, and one unused on every
// rank keeps an undefined gradient, as in one process, so weight decay and
// momentum leave it alone. With find_unused_parameters,
// prepare_for_backward(loss) also walks the autograd graph first and marks
// the parameters it cannot reach as ready at once, so their buckets need not
// wait for the end of backward. A gradient that arrives twice in one step
// (two backward passes without no_sync) after its bucket was launched is an
// error.
//
// Note [gradients in parts]: a parameter read in two places (GPT-2's token
// embedding, which the head reads too) normally gets one gradient a step,
// autograd summing both uses before its accumulator runs. Under
// activation checkpointing the embedding's use is recomputed in a backward
// of its own, so its part arrives after the head's, and marking the
// parameter ready at the first would put half a gradient on the wire.
// Such parameters (DdpOptions::reduced_after_backward; the trainer gives a
// model's tied weights) are never marked ready by their hooks: their
// bucket goes out in after_backward(), once backward is over. The token
// embedding is the model's first parameter, in the last bucket, which is
// reduced last anyway.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <torch/nn/module.h>

#include "tandem/dist/process_group.h"
#include "tandem/parallel/bucket_plan.h"
#include "tandem/parallel/comm_hook.h"

namespace torch::autograd {
struct Node;
}

namespace tandem::parallel {

struct DdpOptions {
  BucketOptions buckets;
  bool broadcast_buffers = true;         // before every forward, as PyTorch's default
  bool find_unused_parameters = false;   // Note [unused parameters]
  std::shared_ptr<CommHook> comm_hook;   // null: all-reduce average (comm_hook.h)
  // Note [gradients in parts]: parameters whose gradient may reach them in
  // several parts a step; their buckets are reduced in after_backward().
  std::vector<torch::Tensor> reduced_after_backward;
  // Parameters this DDP leaves alone: not broadcast at the start, not
  // bucketed, not reduced (each rank's own, reduced elsewhere: expert
  // parallelism's experts).
  std::vector<torch::Tensor> left_out;
};

// When each bucket's reduction started and finished, and when backward
// ended: how much communication the backward pass hid.
struct DdpTimeline {
  std::chrono::steady_clock::time_point backward_end;
  std::vector<std::chrono::steady_clock::time_point> launched, finished;
};

// The share of communication time that ran before backward ended: with U the
// union of the buckets' [launched, finished] intervals, |U before
// backward_end| / |U|. 1 when there was no communication.
double hidden_share(const DdpTimeline& timeline);

class DistributedDataParallel {
 public:
  DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                          std::shared_ptr<dist::ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // Zeroes every gradient in place (one fill per bucket).
  void zero_grad();
  void before_forward();
  // Optional; with find_unused_parameters it finds the parameters `loss`
  // does not depend on (Note [unused parameters]).
  void prepare_for_backward(const torch::Tensor& loss);
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
  const CommHook& comm_hook() const { return *hook_; }

  // Called by the gradient hooks (Note [bucket launch order]).
  void gradient_ready(size_t parameter);

 private:
  void mark_ready(size_t parameter);  // requires mutex_
  void launch_in_order();             // requires mutex_
  bool grad_is_view(size_t parameter) const;
  c10::Stream current_stream() const;  // this thread's, on comm_stream_'s device
  void adopt_view(size_t parameter);  // p.grad() into the bucket, then p.grad() = view

  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<dist::ProcessGroup> group_;
  DdpOptions options_;
  std::shared_ptr<CommHook> hook_;
  std::vector<torch::Tensor> parameters_;  // those that require gradients
  std::vector<std::string> names_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;  // parameter -> bucket
  std::vector<torch::Tensor> flat_;   // one per bucket
  std::vector<torch::Tensor> views_;  // per parameter, into flat_
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  // Note [communication stream]: CUDA only.
  std::optional<c10::Stream> comm_stream_;
  std::vector<c10::Event> launch_events_;  // per bucket
  std::optional<c10::Event> reduced_event_;
  std::vector<uintptr_t> hook_keys_;

  std::atomic<bool> sync_{true};  // false inside no_sync(); read by autograd threads
  std::mutex mutex_;  // guards the per-step state below
  std::vector<int64_t> missing_;  // gradients still to come, per bucket
  bool in_step_ = false;          // between before_forward() and after_backward() (a module may have no parameters)
  std::vector<bool> seen_;        // per parameter, this step: a gradient arrived
  std::vector<bool> deferred_;    // per parameter: DdpOptions::reduced_after_backward
  std::vector<bool> unused_;      // per parameter, this step: unreachable from the loss
  size_t next_launch_ = 0;
  bool reducing_ = false;  // a bucket went out and after_backward() has not run: Note [a step ends in after_backward]
  std::vector<dist::Work> work_;
  // Note [unused parameters]: the last step's used flags, while their
  // reduction may still run (waited for at the next after_backward()).
  torch::Tensor used_;
  dist::Work used_work_;
  DdpTimeline timeline_;
};

}  // namespace tandem::parallel
