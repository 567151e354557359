// tandem/dist/placement.h: where the pieces of a tensor lie on the job's
// mesh, so that the code that consumes tensors (the gradient norm, making
// a tensor whole) derives what to do from them instead of asking which
// parallel plans the run has.
//
//   PlacedTensor t{"h.0.attn.c_attn.weight", p, p};
//   t.tensor_parallel = Placement::shard(0, 3 * C, rows_per_rank);
//   auto whole = whole_of_part(p, t.tensor_parallel, tp_group);
//   auto grads = counted_gradients(tensors, mesh);  // what this rank adds to a norm
//
// Note [placements]: each tensor a rank holds is, on each dimension of the
// mesh (dp, tp), either Replicate (every rank of that dimension holds the
// same values), Shard(dim) (each holds its own rows along `dim`: even
// torch.chunk pieces, or the rows a plan chose, as tensor parallelism
// takes q, k and v's parts of a fused projection), or Partial (each holds
// a summand of the value, pending a sum over the dimension, as gradients
// before their reduction). FSDP's shards are Shard(0) of the (tp part of
// the) parameter; their run of the parameter's memory order says where
// they lie in it (`flat_offset`, `parameter_offset`). The pipeline
// dimension holds no placement: a stage holds its own parameters, disjoint
// from the other stages', except a copy of another stage's (a tied
// weight), which is not `owned`. PyTorch's DTensor names the same three
// placements; this is tandem's own small type over libtorch tensors and
// c10d groups, not a port of it.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <torch/types.h>

#include "tandem/dist/process_group.h"

namespace tandem::dist {

struct Placement {
  enum class Kind : uint8_t { kReplicate, kShard, kPartial };
  Kind kind = Kind::kReplicate;
  int64_t dim = -1;         // Shard: the tensor dimension cut
  int64_t whole_size = 0;   // Shard: the whole tensor's size along dim
  // Shard: the rows along `dim` each rank of the dimension holds, int64,
  // in order (empty: torch.chunk's even pieces of whole_size).
  std::shared_ptr<const std::vector<torch::Tensor>> rows;

  static Placement replicate() { return {}; }
  static Placement partial() {
    Placement p;
    p.kind = Kind::kPartial;
    return p;
  }
  // torch.chunk's pieces of `whole_size` rows along `dim`.
  static Placement shard(int64_t dim, int64_t whole_size);
  // The given rows per rank along `dim` (each an int64 tensor).
  static Placement shard(int64_t dim, int64_t whole_size, std::vector<torch::Tensor> rows);

  bool is_replicate() const { return kind == Kind::kReplicate; }
  bool is_shard() const { return kind == Kind::kShard; }
  bool is_partial() const { return kind == Kind::kPartial; }
  // The rows rank `rank` of `ranks` holds (a Shard's).
  torch::Tensor rows_of(int64_t rank, int64_t ranks) const;
  // "Replicate()", "Shard(0)", "Partial(sum)".
  std::string str() const;
};

// The job's mesh as placements see it: the group of each dimension through
// this rank (null where the run does not have it), the pp x tp ranks of
// one replica, the whole job's, whether the dp ranks hold disjoint pieces
// (FSDP's shards) rather than copies, and under HSDP (Note [hsdp]) the
// ranks that hold copies of the same shards, every piece Replicate over
// them (`data` is then the ranks that shard).
struct PlacementMesh {
  std::shared_ptr<ProcessGroup> job, pipeline, data, tensor, model;
  bool data_sharded = false;
  std::shared_ptr<ProcessGroup> data_replicate;

  // This rank's coordinate along a dimension's group (0 without one).
  static int64_t coordinate(const std::shared_ptr<ProcessGroup>& group) { return group ? group->rank() : 0; }
  static bool spans(const std::shared_ptr<ProcessGroup>& group) { return group && group->size() > 1; }
  // Whether a sum over the job runs along the dp (tp) dimension: where its
  // ranks hold disjoint pieces.
  bool sums_over_data() const { return data_sharded && (spans(data) || spans(data_replicate)); }
  bool sums_over_tensor() const { return spans(tensor); }
  // The smallest group whose ranks hold between them one of each piece:
  // the dimensions whose ranks hold disjoint pieces (a pipeline's stages,
  // tp's parts, FSDP's shards), null when every rank holds them all.
  ProcessGroup* sum_group() const;
};

// A tensor this rank holds, with the name and shape of the whole it is a
// piece of and its placement on each dimension.
struct PlacedTensor {
  PlacedTensor() = default;
  PlacedTensor(std::string name, torch::Tensor tensor, torch::Tensor model_parameter)
      : name(std::move(name)), tensor(std::move(tensor)), model_parameter(std::move(model_parameter)) {}

  std::string name;              // the model's name for the whole
  torch::Tensor tensor;          // what this rank holds and steps (a parameter)
  torch::Tensor model_parameter; // the model's parameter it is (part of)
  // A run of `tensor`'s elements in its memory order (in_memory_order):
  // [flat_offset, flat_offset + flat_numel) are this piece (flat_numel <
  // 0: all of `tensor`, as it is).
  int64_t flat_offset = 0, flat_numel = -1;
  int64_t parameter_offset = 0;  // where the run starts in model_parameter's elements
  Placement data_parallel, tensor_parallel;
  bool owned = true;  // false: a copy of another stage's tensor (Note [placements])

  // The piece of `tensor`, and of its gradient (undefined without one).
  torch::Tensor value() const;
  torch::Tensor grad() const;
};

// A dense tensor's elements in its memory order (its strides: a
// channels-last one's too), 1-D, a view of it. Throws tandem::Error for a
// tensor that is not dense.
torch::Tensor in_memory_order(const torch::Tensor& t);

// Whether this rank counts `t` in a sum over mesh.sum_group() (a norm), so
// that each piece is counted once: an owned tensor, on coordinate 0 of
// each summed dimension where it is replicated.
// Throws tandem::Error for a Partial tensor (its sum is pending).
bool counted_here(const PlacedTensor& t, const PlacementMesh& mesh);

// The gradients this rank counts in the job's gradient norm, and the
// others it holds (clipped with them but counted on another rank).
struct CountedGradients {
  std::vector<torch::Tensor> counted, others;
};
CountedGradients counted_gradients(const std::vector<PlacedTensor>& tensors, const PlacementMesh& mesh);

// The gradients of the pieces that are Partial on `dimension` (a member
// pointer: &PlacedTensor::tensor_parallel) summed over that dimension's
// `group`, in one all-reduce of them all, in order; a collective. Every
// rank of the group must hold the same such pieces in the same order and
// sizes (same_pieces).
void sum_partial_gradients(const std::vector<PlacedTensor>& pieces, Placement PlacedTensor::*dimension,
                           ProcessGroup& group);
// Whether every rank of `group` holds the same runs (the same offsets in
// their parameters and numbers of elements) in the pieces that are
// Partial on `dimension`, in the same order (a collective).
bool same_pieces(const std::vector<PlacedTensor>& pieces, Placement PlacedTensor::*dimension, ProcessGroup& group);

// This rank's part of `whole` (a tensor of the whole's shape) under
// `placement` over `group`; no collective. Replicate and Partial: `whole`.
torch::Tensor part_of_whole(const torch::Tensor& whole, const Placement& placement, const ProcessGroup& group);
// The whole of `part` (this rank's) under `placement` over `group`: the
// Shard's parts all-gathered and put at their rows, the Partial's summed
// (a collective of the group); a Replicate's is a copy of `part`.
torch::Tensor whole_of_part(const torch::Tensor& part, const Placement& placement, ProcessGroup& group);

}  // namespace tandem::dist
