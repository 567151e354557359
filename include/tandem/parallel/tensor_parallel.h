// tandem/parallel/tensor_parallel.h: the operators and layers of tensor
// parallelism (Megatron-LM; torchtitan's ColwiseParallel, RowwiseParallel
// and SequenceParallel): each layer's matrices split over the ranks of a
// tensor-parallel group, which together compute what one rank computes
// with the whole matrices.
//
//   auto tp = mesh.group(dist::MeshDim::kTensor);
//   ColumnParallelLinear up(full_up->weight, full_up->bias, tp);    // rows of W: output features
//   RowParallelLinear down(full_down->weight, full_down->bias, tp); // columns of W: input features
//   auto y = down(torch::gelu(up(x)));   // = full_down(gelu(full_up(x))), one all-reduce
//
// Note [conjugate operators]: a column-parallel layer reads its whole
// input and writes 1/tp of the features; a row-parallel layer reads 1/tp of
// the features and writes a partial sum of the whole output. So a column
// layer followed by a row layer needs one collective in forward (the row
// layer's all-reduce of the partial sums: reduce_from) and one in backward
// (the column layer's input gradient, a partial sum too: copy_to's
// all-reduce). copy_to is the identity in forward and reduce_from the
// identity in backward, so each pair costs two all-reduces per block, as
// in Megatron-LM.
//
// Note [sequence parallel]: between the tensor-parallel regions (norms,
// dropout, the residual stream) every rank would hold the whole sequence
// and compute the same thing. With sequence parallelism each rank holds
// 1/tp of the sequence there: a column layer's input is all-gathered along
// the sequence (gather_sequence; its backward a reduce-scatter), and a row
// layer's partial sums are reduce-scattered along it
// (reduce_scatter_sequence; its backward an all-gather). An all-gather and
// a reduce-scatter move the same bytes as one all-reduce, so the traffic is
// Megatron's, and the activations between the regions are 1/tp.
//
// Note [tensor-parallel shards]: every layer is made from the whole
// layer's tensors (the model built and initialised once, as in one
// process, then cut), so that what trains does not depend on tp. A
// parameter's shard is a copy of its rows (a column layer's weight and
// bias, an embedding's vocabulary rows) or its columns (a row layer's
// weight); a row layer's bias stays whole (added once, after the sum).
// Sizes that tp does not divide are cut as torch.chunk cuts (the first
// ranks one more), except where an all-gather needs equal parts (said
// below).
//
// Every rank of the group calls each operator in the same order (they are
// collectives, in forward and in backward). Thread safety: as any module.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <torch/nn.h>
#include <torch/types.h>

#include "tandem/dist/process_group.h"

namespace tandem::parallel::tp {

// The part [begin, end) of `size` elements that rank `rank` of `world`
// holds: torch.chunk's cut (ceil(size / world) each, the last ones less).
struct Part {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
Part part_of(int64_t size, int64_t rank, int64_t world);

// Note [conjugate operators]
torch::Tensor copy_to(const torch::Tensor& x, dist::ProcessGroup& group);      // identity; backward all-reduce
torch::Tensor reduce_from(const torch::Tensor& x, dist::ProcessGroup& group);  // all-reduce; backward identity
// The ranks' parts of the last dimension concatenated (equal parts); backward: this rank's part.
torch::Tensor gather_last(const torch::Tensor& x, dist::ProcessGroup& group);

// Note [sequence parallel]: along `dim`, which tp must divide.
torch::Tensor split_sequence(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim);   // backward all-gather
torch::Tensor gather_sequence(const torch::Tensor& x, dist::ProcessGroup& group, int64_t dim);  // backward reduce-scatter
torch::Tensor reduce_scatter_sequence(const torch::Tensor& x, dist::ProcessGroup& group,
                                      int64_t dim);  // backward all-gather

struct TensorParallelOptions {
  bool sequence_parallel = false;  // Note [sequence parallel]: inputs/outputs hold 1/tp of dim 1
  bool gather_output = false;      // a column layer's output gathered whole (equal parts needed)
};

// y[..., part] = x W[part]^T + b[part]: the output features of this rank's
// part. `weight` [out, in] and `bias` [out] (or undefined) are the whole
// layer's.
class ColumnParallelLinearImpl : public torch::nn::Module {
 public:
  ColumnParallelLinearImpl(const torch::Tensor& weight, const torch::Tensor& bias,
                           std::shared_ptr<dist::ProcessGroup> group, TensorParallelOptions options = {});
  // As above, with this rank's rows of the weight chosen by `rows` (a
  // fused projection's: the query, key and value heads of this rank).
  ColumnParallelLinearImpl(const torch::Tensor& weight, const torch::Tensor& bias, const torch::Tensor& rows,
                           std::shared_ptr<dist::ProcessGroup> group, TensorParallelOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // this rank's rows

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  TensorParallelOptions options_;
};
TORCH_MODULE(ColumnParallelLinear);

// y = sum over ranks of x[..., part] W[:, part]^T, + b: reads this rank's
// part of the input features (a column layer's output) and writes the
// whole output (with sequence parallelism, this rank's part of the
// sequence of it).
class RowParallelLinearImpl : public torch::nn::Module {
 public:
  RowParallelLinearImpl(const torch::Tensor& weight, const torch::Tensor& bias,
                        std::shared_ptr<dist::ProcessGroup> group, TensorParallelOptions options = {});
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight, bias;  // this rank's columns; the whole bias

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  TensorParallelOptions options_;
};
TORCH_MODULE(RowParallelLinear);

// The rows [part) of a vocabulary's embedding: a token of another rank's
// part looks up zeros here, and the sum over the ranks is the whole
// lookup (with sequence parallelism, reduce-scattered along the sequence).
class VocabParallelEmbeddingImpl : public torch::nn::Module {
 public:
  VocabParallelEmbeddingImpl(const torch::Tensor& weight, std::shared_ptr<dist::ProcessGroup> group,
                             TensorParallelOptions options = {});
  torch::Tensor forward(const torch::Tensor& tokens);
  const Part& vocabulary() const { return vocabulary_; }
  torch::Tensor weight;  // this rank's rows

 private:
  std::shared_ptr<dist::ProcessGroup> group_;
  TensorParallelOptions options_;
  Part vocabulary_;
};
TORCH_MODULE(VocabParallelEmbedding);

// Cross-entropy (natural log, per element, no reduction) of logits whose
// last dimension holds this rank's part `vocabulary` of the classes, with
// PyTorch's label smoothing: the whole logits are never gathered. Three
// all-reduces of one number per row (the max, the sum of exponentials,
// the target's logit; with smoothing, the logits' sum too). `targets`:
// class indices over the whole vocabulary, shaped like logits without its
// last dimension. Equal to torch::nn::functional::cross_entropy(whole
// logits, targets, reduction none) to rounding, with its gradient; float32
// for half or bfloat16 logits (as autocast runs cross_entropy).
torch::Tensor vocab_parallel_cross_entropy(const torch::Tensor& logits, const torch::Tensor& targets,
                                           const Part& vocabulary, int64_t vocab_size, dist::ProcessGroup& group,
                                           double label_smoothing = 0);

}  // namespace tandem::parallel::tp
