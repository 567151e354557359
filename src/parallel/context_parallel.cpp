// Ring attention over a context-parallel group (Note [context parallelism]
// in tandem/parallel/context_parallel.h).
#include "tandem/parallel/context_parallel.h"

#include <torch/torch.h>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/util/check.h"

namespace tandem::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;

// Grouped key/value heads (LLaMA's): each of k's heads serves
// q.size(1) / k.size(1) query heads. The ring passes the key/value heads
// as they are (that many times fewer bytes); each block repeats them for
// the kernel, and their gradients are summed back over the query heads
// they served.
torch::Tensor repeated(const torch::Tensor& kv, int64_t heads) {
  return kv.size(1) == heads ? kv : kv.repeat_interleave(heads / kv.size(1), 1);
}
torch::Tensor summed(const torch::Tensor& grad, int64_t kv_heads) {
  if (grad.size(1) == kv_heads) return grad;
  auto sizes = grad.sizes().vec();
  return grad.view({sizes[0], kv_heads, sizes[1] / kv_heads, sizes[2], sizes[3]}).sum(2);
}

// One block's attention and its rows' log-sum-exp: libtorch's CPU flash
// attention kernel.
std::pair<torch::Tensor, torch::Tensor> attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                               bool causal) {
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
      q.contiguous(), repeated(k, q.size(1)).contiguous(), repeated(v, q.size(1)).contiguous(), /*dropout_p=*/0.0,
      causal);
  return {out, lse};
}

// Its gradients, given the merged output and log-sum-exp of the rows.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attend_backward(const torch::Tensor& grad,
                                                                        const torch::Tensor& q, const torch::Tensor& k,
                                                                        const torch::Tensor& v, const torch::Tensor& out,
                                                                        const torch::Tensor& lse, bool causal) {
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad.contiguous(), q.contiguous(), repeated(k, q.size(1)).contiguous(), repeated(v, q.size(1)).contiguous(),
      out.contiguous(), lse.contiguous(), /*dropout_p=*/0.0, causal);
  return {gq, summed(gk, k.size(1)), summed(gv, v.size(1))};
}

// Rows from .. of (out, lse) merged with a block's (their softmaxes'
// normalisers added, each output weighted by its share).
void merge(torch::Tensor& out, torch::Tensor& lse, const torch::Tensor& block_out, const torch::Tensor& block_lse,
           int64_t from) {
  auto rows_out = out.narrow(2, from, block_out.size(2));
  auto rows_lse = lse.narrow(2, from, block_out.size(2));
  const auto merged = torch::logaddexp(rows_lse, block_lse);
  rows_out.copy_(rows_out * (rows_lse - merged).exp().unsqueeze(-1) +
                 block_out * (block_lse - merged).exp().unsqueeze(-1));
  rows_lse.copy_(merged);
}

// A hop around the ring: `mine` to the next rank, the previous rank's into
// `theirs` (both posted before either is waited on).
struct Hop {
  dist::Work sent, got;
  void wait() {
    sent.wait();
    got.wait();
  }
};
Hop pass(dist::ProcessGroup& group, const torch::Tensor& mine, torch::Tensor& theirs) {
  const int64_t n = group.size(), r = group.rank();
  Hop hop;
  hop.sent = group.send(mine, (r + 1) % n);
  hop.got = group.recv(theirs, (r + n - 1) % n);
  return hop;
}

class RingAttention : public torch::autograd::Function<RingAttention> {
 public:
  // `group`: the group's address (it outlives the graph: ring_attention).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t group_address) {
    auto& group = *reinterpret_cast<dist::ProcessGroup*>(group_address);
    const int64_t n = group.size(), r = group.rank(), half = q.size(2) / 2;
    auto kv = torch::stack({k, v}).contiguous();
    auto next = torch::empty_like(kv);
    Hop hop = pass(group, kv, next);  // the next block travels while this rank's own is computed
    auto [out, lse] = attend(q, k, v, /*causal=*/true);  // fresh tensors, merged into in place
    for (int64_t s = 1; s < n; ++s) {
      hop.wait();
      auto held = next;  // the block of rank (r - s) mod n
      if (s + 1 < n) {
        next = torch::empty_like(held);
        hop = pass(group, held, next);
      }
      const int64_t from = (r - s + n) % n;
      if (from < r) {  // its chunks precede both of this rank's: the first half, seen by every query
        auto [o, l] = attend(q, held[0].narrow(2, 0, half), held[1].narrow(2, 0, half), false);
        merge(out, lse, o, l, 0);
      } else {  // after this rank's first chunk, before its second: all of it, seen by the second's queries
        auto [o, l] = attend(q.narrow(2, half, half), held[0], held[1], false);
        merge(out, lse, o, l, half);
      }
    }
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["group"] = group_address;
    return out;
  }

  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto& group = *reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    const auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto grad = grads[0].contiguous();
    const int64_t n = group.size(), r = group.rank(), half = q.size(2) / 2;
    auto [dq, dk, dv] = attend_backward(grad, q, k, v, out, lse, /*causal=*/true);  // dq: fresh, summed into
    // A block travels with the running sums of its gradients.
    auto packet = torch::stack({k, v, dk, dv}).contiguous();
    for (int64_t s = 1; s < n; ++s) {
      auto received = torch::empty_like(packet);
      pass(group, packet, received).wait();
      packet = received;
      const int64_t from = (r - s + n) % n;
      if (from < r) {
        auto [gq, gk, gv] = attend_backward(grad, q, packet[0].narrow(2, 0, half), packet[1].narrow(2, 0, half), out,
                                            lse, false);
        dq.add_(gq);
        packet[2].narrow(2, 0, half).add_(gk);
        packet[3].narrow(2, 0, half).add_(gv);
      } else {
        auto [gq, gk, gv] =
            attend_backward(grad.narrow(2, half, half), q.narrow(2, half, half), packet[0], packet[1],
                            out.narrow(2, half, half), lse.narrow(2, half, half), false);
        dq.narrow(2, half, half).add_(gq);
        packet[2].add_(gk);
        packet[3].add_(gv);
      }
    }
    // The block held last is the next rank's: one more hop home.
    auto sums = packet.narrow(0, 2, 2).contiguous();
    if (n > 1) {
      auto mine = torch::empty_like(sums);
      pass(group, sums, mine).wait();
      sums = mine;
    }
    return {dq, sums[0], sums[1], torch::Tensor()};
  }
};

}  // namespace

torch::Tensor context_positions(int64_t length, int64_t rank, int64_t ranks) {
  TANDEM_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "context parallelism: rank ", rank, " of ", ranks);
  TANDEM_CHECK_USAGE(length % (2 * ranks) == 0, "context parallelism over ", ranks, " ranks cuts each sequence into ",
                     2 * ranks, " equal chunks: a sequence of ", length, " tokens does not divide; use a length that ",
                     2 * ranks, " divides");
  const int64_t chunk = length / (2 * ranks);
  return torch::cat({torch::arange(rank * chunk, (rank + 1) * chunk, torch::kInt64),
                     torch::arange((2 * ranks - 1 - rank) * chunk, (2 * ranks - rank) * chunk, torch::kInt64)});
}

torch::Tensor context_part(const torch::Tensor& t, int64_t dim, int64_t rank, int64_t ranks) {
  return t.index_select(dim, context_positions(t.size(dim), rank, ranks).to(t.device()));
}

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const std::shared_ptr<dist::ProcessGroup>& group) {
  TANDEM_CHECK(q.dim() == 4 && k.dim() == 4 && k.sizes() == v.sizes() && q.size(0) == k.size(0) &&
                   q.size(2) == k.size(2) && q.size(3) == k.size(3) && k.size(1) > 0 && q.size(1) % k.size(1) == 0,
               "ring attention: q, k and v must be [batch, heads, tokens, head size], k and v alike with heads that "
               "divide q's, got ", q.sizes(), ", ", k.sizes(), ", ", v.sizes());
  if (!group || group->size() == 1) {
    return at::scaled_dot_product_attention(q, repeated(k, q.size(1)), repeated(v, q.size(1)), /*attn_mask=*/{},
                                            /*dropout_p=*/0.0, /*is_causal=*/true);
  }
  TANDEM_CHECK(q.size(2) % 2 == 0, "ring attention: a rank holds two equal chunks of the sequence, got ", q.size(2),
               " tokens");
  TANDEM_CHECK(q.device().is_cpu(), "ring attention: on the CPU only for now, got ", q.device().str());
  return RingAttention::apply(q, k, v, reinterpret_cast<int64_t>(group.get()));
}

void split_context(models::Sequence& model, const std::shared_ptr<dist::ProcessGroup>& group) {
  TANDEM_CHECK(group != nullptr, "context parallelism: no group");
  models::ContextSplit split;
  split.parts = group->size();
  const int64_t rank = group->rank(), parts = group->size();
  split.positions = [rank, parts](int64_t held, const torch::Device& device) {
    return context_positions(held * parts, rank, parts).to(device);
  };
  split.attend = [group](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return ring_attention(q, k, v, group);
  };
  int64_t attention = 0;
  for (const auto& module : model->modules(/*include_self=*/false)) {
    if (auto* embedding = dynamic_cast<models::Gpt2EmbeddingImpl*>(module.get())) {
      embedding->context = split;
      embedding->context.attend = nullptr;  // positions only
    } else if (auto* gpt2 = dynamic_cast<models::Gpt2AttentionImpl*>(module.get())) {
      gpt2->context = split;
      ++attention;
    } else if (auto* llama = dynamic_cast<models::LlamaAttentionImpl*>(module.get())) {
      llama->context = split;
      ++attention;
    }
  }
  TANDEM_CHECK(attention > 0, "context parallelism: the model has no GPT-2 or LLaMA attention to cut over ranks");
}

}  // namespace tandem::parallel
