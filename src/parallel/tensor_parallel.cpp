// The collectives of tensor parallelism as autograd operators
// (tensor_parallel.h: Note [conjugate operators], Note [sequence parallel]).
#include "tandem/parallel/tensor_parallel.h"

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::parallel::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void keep_group(AutogradContext* ctx, dist::ProcessGroup* group, int64_t dim = 0) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
  ctx->saved_data["dim"] = dim;
}
dist::ProcessGroup& group_of(AutogradContext* ctx) {
  return *reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
}
int64_t dim_of(AutogradContext* ctx) { return ctx->saved_data["dim"].toInt(); }

torch::Tensor all_reduced(const torch::Tensor& x, dist::ProcessGroup& group) {
  auto y = x.contiguous().clone();
  if (group.size() > 1) group.all_reduce(y).wait();
  return y;
}

// The ranks' equal parts of `dim`, concatenated in rank order.
torch::Tensor all_gathered(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  if (group.size() == 1) return x.clone();
  auto part = x.contiguous();
  std::vector<torch::Tensor> parts;
  for (int64_t r = 0; r < group.size(); ++r) parts.push_back(torch::empty_like(part));
  group.all_gather(parts, part).wait();
  return torch::cat(parts, dim);
}

// This rank's part of `dim` of the sum over the ranks.
torch::Tensor reduce_scattered(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  const int64_t world = group.size();
  TANDEM_CHECK(x.size(dim) % world == 0, "tensor parallel: a dimension of ", x.size(dim), " cannot be reduce-scattered "
               "over ", world, " ranks in equal parts (sequence parallelism needs the sequence a multiple of tp)");
  if (world == 1) return x.clone();
  std::vector<torch::Tensor> inputs;
  for (const auto& chunk : x.chunk(world, dim)) inputs.push_back(chunk.contiguous());
  auto output = torch::empty_like(inputs[0]);
  group.reduce_scatter(output, inputs, dist::ReduceOp::kSum).wait();
  return output;
}

torch::Tensor own_part(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  const int64_t world = group.size();
  TANDEM_CHECK(x.size(dim) % world == 0, "tensor parallel: a dimension of ", x.size(dim), " cannot be split over ",
               world, " ranks in equal parts");
  return x.chunk(world, dim)[group.rank()].contiguous();
}

struct CopyTo : torch::autograd::Function<CopyTo> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::ProcessGroup* group) {
    keep_group(ctx, group);
    return x;  // autograd makes the output a view of its own
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_reduced(grads[0], group_of(ctx)), torch::Tensor()};
  }
};

struct ReduceFrom : torch::autograd::Function<ReduceFrom> {
  static torch::Tensor forward(AutogradContext*, const torch::Tensor& x, dist::ProcessGroup* group) {
    return all_reduced(x, *group);
  }
  static variable_list backward(AutogradContext*, variable_list grads) { return {grads[0], torch::Tensor()}; }
};

struct GatherAlong : torch::autograd::Function<GatherAlong> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::ProcessGroup* group, int64_t dim) {
    keep_group(ctx, group, dim);
    return all_gathered(x, *group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {own_part(grads[0], group_of(ctx), dim_of(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

// gather_sequence: all-gather forward, reduce-scatter backward (each
// rank's gradient of the gathered tensor is a partial sum).
struct GatherSequence : torch::autograd::Function<GatherSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::ProcessGroup* group, int64_t dim) {
    keep_group(ctx, group, dim);
    return all_gathered(x, *group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scattered(grads[0], group_of(ctx), dim_of(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

struct ReduceScatterSequence : torch::autograd::Function<ReduceScatterSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::ProcessGroup* group, int64_t dim) {
    keep_group(ctx, group, dim);
    return reduce_scattered(x, *group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gathered(grads[0], group_of(ctx), dim_of(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

struct SplitSequence : torch::autograd::Function<SplitSequence> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, dist::ProcessGroup* group, int64_t dim) {
    keep_group(ctx, group, dim);
    return own_part(x, *group, dim);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gathered(grads[0], group_of(ctx), dim_of(ctx)), torch::Tensor(), torch::Tensor()};
  }
};

int64_t wrapped(const torch::Tensor& x, int64_t dim) {
  TANDEM_CHECK(x.dim() > 0, "tensor parallel: a 0-dim tensor has no dimension to split");
  return dim < 0 ? dim + x.dim() : dim;
}

}  // namespace

Part part_of(int64_t size, int64_t rank, int64_t world) {
  TANDEM_CHECK(world >= 1 && rank >= 0 && rank < world && size >= 0, "tensor parallel: no part ", rank, " of ", world,
               " of ", size, " elements");
  const int64_t each = (size + world - 1) / world;
  const int64_t begin = std::min(size, rank * each);
  return {begin, std::min(size, begin + each)};
}

torch::Tensor copy_to(const torch::Tensor& x, dist::ProcessGroup& group) { return CopyTo::apply(x, &group); }
torch::Tensor reduce_from(const torch::Tensor& x, dist::ProcessGroup& group) { return ReduceFrom::apply(x, &group); }
torch::Tensor gather_last(const torch::Tensor& x, dist::ProcessGroup& group) {
  return GatherAlong::apply(x, &group, wrapped(x, -1));
}
torch::Tensor split_sequence(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  return SplitSequence::apply(x, &group, wrapped(x, dim));
}
torch::Tensor gather_sequence(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  return GatherSequence::apply(x, &group, wrapped(x, dim));
}
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim) {
  return ReduceScatterSequence::apply(x, &group, wrapped(x, dim));
}

}  // namespace tandem::parallel::tp
