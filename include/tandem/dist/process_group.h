// tandem/dist/process_group.h: a group of ranks and its collectives.
//
// The one tandem header in front of c10d (libtorch's communication layer):
// TCPStore for the rendezvous, ProcessGroupGloo for CPU tensors and
// ProcessGroupNCCL for CUDA tensors. Only the files of src/dist include
// c10d (through src/dist/internal.h; process_group.cpp for the backends),
// so a libtorch upgrade touches those alone.
//
// Every collective is asynchronous and returns a Work; Work::wait() blocks
// until it completes or the group's timeout passes, and throws
// tandem::dist::CommunicationError (tandem/dist/communication_error.h)
// naming the collective, the rank and the cause (a peer that died, a
// timeout), with the ranks that did not answer as its facts. Ranks must call collectives in the same order with matching
// shapes, as with torch.distributed.
//
// Note [waiting on NCCL]: with NCCL, wait() does not block the host. It makes
// the calling thread's current CUDA stream wait for the collective (what
// torch.distributed's work.wait() and PyTorch's DDP do), so later kernels,
// copies to the host (.cpu(), .item()) included, see its result. c10d blocks
// the host instead as soon as a timeout is passed to its wait, which would
// stall the GPU's queue at every DDP bucket. The timeout is then enforced by
// ProcessGroupNCCL's watchdog, created with the group's timeout: it names
// the collective (OpType, sequence number) and ends the process, which the
// launcher turns into the end of every rank. barrier() still blocks the host.
//
// In a group of one, all_reduce and broadcast complete at once without a
// backend call (they could only copy a tensor onto itself); the other
// collectives still go through the backend.
//
// Thread safety: one thread issues the collectives of a group; a Work may be
// waited on from another thread. Different groups may launch from different
// threads at once (Note [one launch at a time] in src/dist/process_group.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/rendezvous.h"

namespace tandem::dist {

enum class ReduceOp { kSum, kAvg, kMin, kMax };

// Note [traffic]: what a group's collectives carried from this rank, per
// collective ("all_reduce", "send", ...): the calls, and the bytes of the
// tensors this rank handed in (all_reduce, broadcast, reduce: the tensor;
// all_gather, gather: the input; scatter: the inputs on the root;
// reduce_scatter: the inputs; send and recv: the tensor). That is the
// payload, whatever algorithm the backend sends it with (a ring
// all-reduce puts 2 (n - 1) / n of it on the wire), and it is
// deterministic: benches and tests compare it with the analytic figure of
// a parallelism. A group of one counts the call and no bytes. A
// duplicate's traffic counts in the group it duplicates too, so a group
// reports everything sent over its ranks by the parts built on it.
struct Traffic {
  int64_t calls = 0;
  int64_t bytes = 0;
};

struct GroupOptions {
  std::string backend = "auto";  // auto (nccl for a CUDA device, else gloo) | gloo | nccl
  std::string device = "cpu";    // the device this rank computes on (chooses auto's backend)
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};  // --dist-timeout
};

class Work {
 public:
  Work() = default;
  // Blocks until done (NCCL: the current CUDA stream waits, Note [waiting on
  // NCCL]); throws tandem::Error on failure or timeout. Waiting twice is
  // allowed (the second returns at once).
  void wait();
  // Whether the collective has finished (successfully or not), without
  // blocking; the steps registered with then() run only in wait().
  bool completed() const;
  // When the collective itself finished (recorded by the backend's thread,
  // not by wait()); empty while it runs, or where the backend cannot say.
  std::optional<std::chrono::steady_clock::time_point> finished_at() const;
  // Runs `f` inside wait(), once, after the collective succeeded and after
  // any step already registered (e.g. the division of an average): how a
  // communication hook decompresses its result.
  Work& then(std::function<void()> f);
  struct Impl;
  explicit Work(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

 private:
  std::shared_ptr<Impl> impl_;
};

class ProcessGroup {
 public:
  // Joins the group described by `rendezvous`: rank 0 starts the store
  // server, every rank connects within options.timeout. Throws tandem::Error
  // for a port in use, an unreachable store, a rank that never came, or an
  // unknown backend.
  ProcessGroup(const Rendezvous& rendezvous, const GroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;

  int64_t rank() const;
  int64_t size() const;
  const std::string& backend() const;  // "gloo" or "nccl"
  std::chrono::milliseconds timeout() const;

  // In place on `tensor` (every rank gets the result).
  Work all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
  // Several tensors (of one dtype) in one operation, e.g. a bucket's gradients.
  Work all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op = ReduceOp::kSum);
  Work broadcast(torch::Tensor& tensor, int64_t root);
  // The result lands in `tensor` on `root` only.
  Work reduce(torch::Tensor& tensor, int64_t root, ReduceOp op = ReduceOp::kSum);
  // outputs: one tensor per rank, shaped like input.
  Work all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input);
  // outputs: one per rank on root, empty elsewhere.
  Work gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input, int64_t root);
  // inputs: one per rank on root, empty elsewhere.
  Work scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs, int64_t root);
  // output = reduction over ranks of inputs[rank]; inputs: one per rank.
  Work reduce_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                      ReduceOp op = ReduceOp::kSum);
  // Rows of `input` to every rank and theirs into `output` (c10d's
  // alltoall_base): input_splits[j] rows (along dim 0) go to rank j in
  // rank order, output_splits[j] come from rank j; the sizes may differ per
  // rank (expert parallelism's uneven dispatch).
  Work all_to_all(torch::Tensor& output, const torch::Tensor& input, const std::vector<int64_t>& output_splits,
                  const std::vector<int64_t>& input_splits);
  Work barrier();
  // Where this group's collectives take their tensors: this rank's device
  // (GroupOptions::device) under NCCL, the CPU under Gloo.
  torch::Device wire_device() const;
  Work send(const torch::Tensor& tensor, int64_t dst, int tag = 0);
  Work recv(torch::Tensor& tensor, int64_t src, int tag = 0);

  // Another group of the same ranks and backend, over this group's store
  // under `name`, with connections of its own (with NCCL, its own
  // communicators and streams, so its traffic never queues behind this
  // group's). Every rank calls it, in the same order, with the same name.
  std::shared_ptr<ProcessGroup> duplicate(const std::string& name);

  // This group's traffic from this rank since it was made or last reset
  // (Note [traffic]), by collective name.
  std::map<std::string, Traffic> traffic() const;
  void reset_traffic();

  // A group of `ranks` (ranks of this group, increasing, this rank among
  // them), as torch.distributed.new_group: every rank of this group calls
  // split() in the same order, each with the ranks of its own slice (a
  // device mesh's row or column). The split's ranks count from 0, in the
  // order given; its messages name `label` and the job's ranks, and a
  // timeout in it names the job's rank that did not come (Note [splits] in
  // src/dist/split.cpp).
  std::shared_ptr<ProcessGroup> split(const std::string& label, const std::vector<int64_t>& ranks);
  // The job's rank of each of this group's ranks (0, 1, ... for the job's
  // group and its duplicates).
  std::vector<int64_t> job_ranks() const;

  struct Impl;

 private:
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Held by every Gloo launch of this process, for as long as the launch (not
// the wait) takes: Note [one launch at a time] in src/dist/process_group.cpp.
// Public for the tests; code outside src/dist has no reason to take it.
std::mutex& gloo_launch_mutex();

// Whether this process can make NCCL groups: the CUDA module is loaded and
// was compiled with NCCL's headers (Note [nccl headers] in
// src/cuda/nccl_group.cpp); they also need a CUDA device at run time.
bool built_with_nccl();

// A port on `host` that was free a moment ago, for launchers and tests:
// drawn at random below the kernel's ephemeral range and checked by binding
// it, so that no outgoing connection takes it before the store binds it
// (Note [ports outside the ephemeral range] in src/dist/process_group.cpp);
// the kernel's pick (port 0) where that range leaves no room. Throws at once
// naming `host` when it is empty, cannot be resolved, or is not an address
// of this machine.
int pick_free_port(const std::string& host = "127.0.0.1");

// Whether `message` (an error this process is about to report) contains the
// error of one of its collectives, or of its store, that failed: the error
// of a rank that most likely lost a peer, rather than one of its own
// (Note [first failure] in tandem/launch/worker_error.h).
bool is_communication_failure(const std::string& message);

}  // namespace tandem::dist
