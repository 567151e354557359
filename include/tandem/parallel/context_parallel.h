// tandem/parallel/context_parallel.h: attention over a sequence whose
// tokens are split across the ranks of a group (context parallelism), as
// Megatron-LM's and torchtitan's context parallelism compute it.
//
//   auto mine = context_positions(T, cp->rank(), cp->size());    // which tokens
//   auto q_part = context_part(q, /*dim=*/2, cp->rank(), cp->size());
//   auto y = ring_attention(q_part, k_part, v_part, cp);  // [B, H, T/cp, D]
//
// Note [context parallelism]: a sequence of T tokens is cut into 2 cp equal
// chunks and rank r holds chunks r and 2 cp - 1 - r, so that under a
// causal mask every rank has the same work (the early chunk attends to
// few keys, the late one to many). Each rank computes its queries'
// attention over every rank's keys and values by passing the key/value
// blocks around the ring of the group (cp - 1 hops), sending the next
// block while it computes with the one it has. Each block's attention is
// libtorch's own (the CPU flash-attention kernel, which returns the rows'
// log-sum-exp), and the partial results are merged exactly by their
// log-sum-exps. With the zig-zag chunks a received block is either seen
// whole by both of a rank's chunks' queries up to the first half (the
// sender's chunks come before this rank's first), or by the later chunk
// alone; only a rank's own block needs the causal mask. Backward passes
// the blocks around again with their gradients' running sums, which one
// more hop returns to the block's owner: each block's gradient uses the
// merged output and log-sum-exp, as flash attention's backward does, so
// the gradients are one process's to rounding.
// Traffic per attention and rank: forward (cp - 1) blocks of k and v;
// backward (cp - 1) blocks of k, v and their gradients, plus one of the
// gradients; a block is [B, H_kv, T/cp, D] each (the key/value heads).
#pragma once

#include <cstdint>
#include <memory>

#include <torch/types.h>

#include "tandem/dist/process_group.h"
#include "tandem/models/sequence.h"

namespace tandem::parallel {

// The token positions (int64, ascending) that rank `rank` of `ranks` holds
// of a sequence of `length`: chunks rank and 2 ranks - 1 - rank of 2 ranks
// equal chunks. Throws tandem::UsageError when 2 ranks does not divide it.
torch::Tensor context_positions(int64_t length, int64_t rank, int64_t ranks);

// `t`'s part along `dim` (its sequence dimension) at context_positions.
torch::Tensor context_part(const torch::Tensor& t, int64_t dim, int64_t rank, int64_t ranks);

// Causal attention of this rank's queries over the whole sequence, whose
// keys and values the ranks of `group` hold in the parts context_positions
// gives: q [B, H, T/cp, D], k and v [B, H_kv, T/cp, D] with H_kv dividing
// H (grouped key/value heads, passed around the ring as they are), on the
// CPU. Returns this rank's rows of
// one process's causal scaled_dot_product_attention over the whole; its
// gradients are those rows' too. A collective of `group` in forward and
// in backward; `group` must outlive the graph. Null or a group of one: the
// plain causal attention.
torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const std::shared_ptr<dist::ProcessGroup>& group);

// Cuts `model`'s attention over `group` (Note [context split] in
// models/split_region.h): GPT-2's and LLaMA's layers then take this
// rank's part of each sequence (context_part of its tokens along dim 1)
// at its positions and attend over the whole through ring_attention. The
// loss of a rank's tokens, averaged over the group's ranks (their tokens
// are equal in number), is one process's loss of the whole batch, and so
// are its gradients. Throws tandem::Error for a model without such layers.
void split_context(models::Sequence& model, const std::shared_ptr<dist::ProcessGroup>& group);

}  // namespace tandem::parallel
