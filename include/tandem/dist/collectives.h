// tandem/dist/collectives.h: collective helpers built on ProcessGroup.
#pragma once

#include <string>
#include <vector>

#include <torch/nn/module.h>

#include "tandem/dist/process_group.h"

namespace tandem::dist {

// Every rank's `text`, index r holding rank r's: two all_gathers (the
// lengths, then the bytes padded to the longest) of tensors on `device`
// (NCCL takes CUDA tensors only). For checks at start-up, not a hot path.
std::vector<std::string> all_gather_text(const std::string& text, ProcessGroup& group, const torch::Device& device);

// Whether every rank of `group` passed the same list of `values` (its
// length included): the lists padded to the longest, then an all_reduce of
// the minimum and one of the maximum, equal where every rank's are. For
// checks at start-up (do the ranks' layouts agree?), not a hot path.
bool same_on_every_rank(const std::vector<int64_t>& values, ProcessGroup& group);

// Seed 004's hand-written data parallelism: after backward, every gradient
// is all-reduced and divided by the world size, so each rank holds the mean
// gradient. The reductions of all parameters are started at once and then
// waited for in order. Parameters without a gradient are skipped (the same
// set on every rank, or the ranks fall out of step).
void average_gradients(torch::nn::Module& module, ProcessGroup& group);
// The same for the gradients of `parameters` only.
void average_gradients(const std::vector<torch::Tensor>& parameters, ProcessGroup& group);

// Broadcasts `tensors` from `root` in place, coalesced: tensors of one dtype
// and device are packed into flat buffers of at most `bucket_bytes` (a
// tensor larger than that goes alone), one broadcast each, and unpacked
// again. Far fewer collectives than one per tensor (a ResNet-18 has 60
// BatchNorm buffers).
void broadcast_coalesced(std::vector<torch::Tensor> tensors, ProcessGroup& group, int64_t root = 0,
                         int64_t bucket_bytes = int64_t(256) << 20);

// The same, started: the packs are sent when this returns, and wait() waits
// for them and unpacks them into the tensors (which must stay untouched
// until then). Several started from different roots run back to back in the
// group, without the host's unpacking between them (optim::ZeroSgd's shares).
class CoalescedBroadcast {
 public:
  CoalescedBroadcast(std::vector<torch::Tensor> tensors, ProcessGroup& group, int64_t root,
                     int64_t bucket_bytes = int64_t(256) << 20);
  void wait();

 private:
  std::vector<torch::Tensor> tensors_, flat_;
  std::vector<std::vector<size_t>> members_;  // per pack, its tensors
  std::vector<Work> pending_;
  bool receiver_ = false;
};

// Broadcasts every parameter and buffer of `module` from `root` (how DDP
// starts all ranks from the same weights).
void broadcast_module(torch::nn::Module& module, ProcessGroup& group, int64_t root = 0);

// Broadcasts only the buffers (BatchNorm running statistics), as DDP does
// before every forward pass by default.
void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int64_t root = 0);

// Every rank must hold the same parameters: a hash of the names and shapes,
// all-gathered and compared. Throws tandem::Error, prefixed with `who`,
// naming the first rank that differs from rank 0. A collective.
void check_same_parameters(torch::nn::Module& module, ProcessGroup& group, const std::string& who);

}  // namespace tandem::dist
