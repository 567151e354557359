// What each rank holds of the run's state as pieces of the whole tensors
// (Trainer::state_pieces, Note [held state]): for a sharded checkpoint
// (Note [sharded checkpoints] in checkpoint/sharded_checkpoint.h) a tensor
// replicated over the data-parallel ranks is written by the first of
// them, a sharded one by every owner of a part, and a pipeline rank writes
// only its own stage's pieces; a resume fills every piece each rank holds.
#include <algorithm>
#include <functional>
#include <unordered_map>

#include <c10/util/accumulate.h>

#include "tandem/dist/placement.h"
#include "tandem/engine/trainer.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/util/check.h"

namespace tandem::engine {
namespace {

struct Named {
  std::string name;
  int64_t order = 0;
};
using NameOf = std::unordered_map<const c10::TensorImpl*, Named>;

// Every parameter and buffer of `module` by its name in the model, numbered
// in the order Module::save writes them (a one-file checkpoint's order).
void number_tensors(const torch::nn::Module& module, const std::string& prefix, NameOf& names, int64_t& order) {
  for (const auto& p : module.named_parameters(/*recurse=*/false)) {
    names[p.value().unsafeGetTensorImpl()] = {"model." + prefix + p.key(), order++};
  }
  for (const auto& b : module.named_buffers(/*recurse=*/false)) {
    names[b.value().unsafeGetTensorImpl()] = {"model." + prefix + b.key(), order++};
  }
  for (const auto& child : module.named_children()) {
    if (child.value()->is_serializable()) number_tensors(*child.value(), prefix + child.key() + ".", names, order);
  }
}

std::vector<int64_t> packed_strides(c10::IntArrayRef shape) {
  std::vector<int64_t> strides(shape.size());
  int64_t stride = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = stride;
    stride *= std::max<int64_t>(shape[d], 1);
  }
  return strides;
}

checkpoint::StatePiece whole(const Named& named, const torch::Tensor& t) {
  auto data = t.detach().contiguous().reshape({-1});
  return {named.name, named.order, t.sizes().vec(), packed_strides(t.sizes()), 0, data};
}
// `t` whole as a reader fills it: a view of its memory, in its own order.
checkpoint::StatePiece whole_in_place(const Named& named, const torch::Tensor& t) {
  return {named.name, named.order, t.sizes().vec(), t.strides().vec(), 0, dist::in_memory_order(t.detach())};
}

// Note [tensor-parallel checkpoints] (parallel/tensor_parallel_plan.h):
// this rank's part of a cut tensor, as pieces of the whole. The whole's
// memory order puts the cut dimension outermost (its strides say so, the
// same on every tp rank), so each run of consecutive indices this rank
// holds along it is one run of the whole's elements.
// A piece along another dimension than the first is a copy: with
// `write_backs`, each puts its copy back into `part` (after a read).
void add_cut_pieces(std::vector<checkpoint::StatePiece>& pieces, const Named& named, const torch::Tensor& part,
                    const dist::Placement& cut, int64_t rank, int64_t ranks,
                    std::vector<std::function<void()>>* write_backs = nullptr) {
  const int64_t dim = cut.dim;
  auto shape = part.sizes().vec();
  shape[static_cast<size_t>(dim)] = cut.whole_size;
  std::vector<int64_t> strides(shape.size());
  int64_t inner = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    if (static_cast<int64_t>(d) == dim) continue;
    strides[d] = inner;
    inner *= std::max<int64_t>(shape[d], 1);
  }
  strides[static_cast<size_t>(dim)] = inner;
  const auto index = cut.rows_of(rank, ranks).contiguous();
  const auto* at = index.data_ptr<int64_t>();
  const int64_t count = index.numel();
  for (int64_t begin = 0; begin < count;) {
    int64_t end = begin + 1;
    while (end < count && at[end] == at[end - 1] + 1) ++end;
    auto rows = part.detach().narrow(dim, begin, end - begin).movedim(dim, 0);
    auto run = rows.contiguous().reshape({-1});
    if (write_backs && !run.is_alias_of(rows)) write_backs->push_back([rows, run]() mutable { rows.copy_(run.view(rows.sizes())); });
    pieces.push_back({named.name, named.order, shape, strides, at[begin] * inner, run});
    begin = end;
  }
}

// Note [fsdp x tp checkpoints]: FSDP's shard of a tp rank's part holds a
// run of the part's elements in its row-major order (`offset`, `run`),
// which in the whole tensor are scattered: each element's index in the
// part, its cut coordinate replaced by the whole's row (the placement's
// rows of this rank), raveled in the whole's row-major shape; consecutive
// indices make one piece. Row-major keeps a run of a part's row whole in
// the whole, whichever dimension tp cut.
void add_run_pieces(std::vector<checkpoint::StatePiece>& pieces, const Named& named,
                    const parallel::FullyShardedDataParallel::ShardSpan& span, const dist::Placement& cut,
                    int64_t rank, int64_t ranks, const torch::Tensor& run) {
  const auto& part_shape = span.shape;
  TANDEM_CHECK(span.strides == packed_strides(part_shape), "sharded checkpoint: ", named.name,
               "'s part is not in row-major order");
  auto whole_shape = part_shape;
  whole_shape[static_cast<size_t>(cut.dim)] = cut.whole_size;
  const auto rows = cut.rows_of(rank, ranks);
  const auto index = torch::arange(span.offset, span.offset + run.numel(), torch::kLong);
  auto at = torch::zeros_like(index);
  int64_t part_stride = 1, whole_stride = 1;
  for (size_t d = part_shape.size(); d-- > 0;) {
    auto coordinate = index.div(part_stride, "floor").remainder(part_shape[d]);
    if (static_cast<int64_t>(d) == cut.dim) coordinate = rows.index_select(0, coordinate);
    at += coordinate * whole_stride;
    part_stride *= part_shape[d];
    whole_stride *= whole_shape[d];
  }
  const auto* where = at.data_ptr<int64_t>();
  const auto strides = packed_strides(whole_shape);
  for (int64_t begin = 0, count = at.numel(); begin < count;) {
    int64_t end = begin + 1;
    while (end < count && where[end] == where[end - 1] + 1) ++end;
    pieces.push_back({named.name, named.order, whole_shape, strides, where[begin], run.narrow(0, begin, end - begin)});
    begin = end;
  }
}

// Note [expert checkpoints]: under ep an expert weight (or its optimizer
// state) holds rows [first, first + held) of dim 0 of the whole (all the
// experts), and under tp its part of the features along `cut`'s dim
// (never 0). The whole's memory order puts dim 0 outermost, then the cut
// dim, then the others, so that each held expert's run of consecutive tp
// rows is one run of the whole's elements (without a cut, all the held
// experts are one run). Every rank writing or reading such a tensor uses
// this order, whichever layout it has.
void add_expert_pieces(std::vector<checkpoint::StatePiece>& pieces, const Named& named, const torch::Tensor& part,
                       int64_t first, int64_t experts, const dist::Placement* cut, int64_t rank, int64_t ranks,
                       std::vector<std::function<void()>>* write_backs) {
  auto shape = part.sizes().vec();
  shape[0] = experts;
  const int64_t dim = cut ? cut->dim : -1;
  TANDEM_CHECK(dim != 0, "sharded checkpoint: ", named.name, " is cut by tp along the experts' dimension");
  if (cut) shape[static_cast<size_t>(dim)] = cut->whole_size;
  std::vector<int64_t> strides(shape.size());
  int64_t inner = 1;
  for (size_t d = shape.size(); d-- > 1;) {
    if (static_cast<int64_t>(d) == dim) continue;
    strides[d] = inner;
    inner *= std::max<int64_t>(shape[d], 1);
  }
  if (cut) {
    strides[static_cast<size_t>(dim)] = inner;
    inner *= std::max<int64_t>(shape[static_cast<size_t>(dim)], 1);
  }
  strides[0] = inner;  // one expert's elements
  auto keep = [&](const torch::Tensor& view, int64_t offset) {
    auto run = view.contiguous().reshape({-1});
    if (write_backs && !run.is_alias_of(view)) {
      write_backs->push_back([view, run]() mutable { view.copy_(run.view(view.sizes())); });
    }
    pieces.push_back({named.name, named.order, shape, strides, offset, run});
  };
  if (!cut) {
    keep(part.detach(), first * inner);
    return;
  }
  const auto index = cut->rows_of(rank, ranks).contiguous();
  const auto* at = index.data_ptr<int64_t>();
  for (int64_t e = 0; e < part.size(0); ++e) {
    const auto expert = part.detach()[e];  // the cut dim is dim - 1 here
    for (int64_t begin = 0, count = index.numel(); begin < count;) {
      int64_t end = begin + 1;
      while (end < count && at[end] == at[end - 1] + 1) ++end;
      keep(expert.narrow(dim - 1, begin, end - begin).movedim(dim - 1, 0),
           (first + e) * strides[0] + at[begin] * strides[static_cast<size_t>(dim)]);
      begin = end;
    }
  }
}

}  // namespace

// Note [held state]: a checkpoint's pieces and a resume's are one walk over
// what this rank holds. Writing, each piece is written once in the job: a
// tensor alike on several ranks (dp replicas, HSDP copies, tp's whole
// tensors) by the first of them. Reading (Note [loading by overlap]),
// every rank fills all it holds, and the optimizer's state, which a fresh
// optimizer does not have yet, is read into fresh tensors shaped as the
// state would be (optim::state_slots), made the optimizer's once filled.
Trainer::HeldState Trainer::state_pieces(torch::optim::Optimizer& optimizer, StateUse use) const {
  const bool reading = use == StateUse::kRead;
  NameOf names;
  int64_t order = 0;
  number_tensors(*model_, "", names, order);
  // The optimizer's state after the model's tensors, in the parameters'
  // order, each parameter's slots in their order (optim/state_tensors.h).
  NameOf parameter_names;
  for (const auto& p : model_->named_parameters()) {
    parameter_names[p.value().unsafeGetTensorImpl()] = {"optimizer." + p.key() + ".", order};
    order += optim::kMaxStateSlots;
  }
  auto name_of = [](const NameOf& map, const torch::Tensor& t) -> const Named& {
    auto found = map.find(t.unsafeGetTensorImpl());
    TANDEM_CHECK(found != map.end(), "sharded checkpoint: a tensor that is not the model's");
    return found->second;
  };
  // The state of `local` (the tensor the optimizer steps) as named
  // tensors: its own, or fresh ones to read into.
  HeldState held;
  auto state_of = [&](const torch::Tensor& local, const Named& base) {
    if (!reading) return optim::parameter_state(optimizer, local);
    HeldState::Fresh fresh{local, {}, {}};
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& slot : optim::state_slots(optimizer, local)) {
      auto t = torch::zeros(slot.shape, local.options().dtype(slot.dtype).device(torch::kCPU));
      named.emplace_back(slot.name, t);
      fresh.state[slot.name] = t;
      fresh.names.push_back(base.name + slot.name);
    }
    held.state.push_back(std::move(fresh));
    return named;
  };
  auto whole_piece = [&](const Named& named, const torch::Tensor& t) {
    return reading ? whole_in_place(named, t) : whole(named, t);
  };
  // The modules this rank runs: its own pipeline pieces, or the whole model.
  const auto mine = mesh_.modules_here(*model_);
  const bool first_replica = reading || MeshPlan::first_of(mesh_.groups.data);  // of the dp slice through this rank
  // Under tp a whole tensor (the same on every tp rank) is the first tp
  // rank's to write, a cut one every tp rank's part.
  const bool first_part = reading || MeshPlan::first_of(mesh_.groups.tensor);
  auto& pieces = held.pieces;
  if (first_replica && first_part) {
    for (auto* module : mine) {
      for (const auto& b : module->buffers()) pieces.push_back(whole_piece(name_of(names, b), b));
    }
  }
  if (auto* fsdp = plan_->fully_sharded()) {
    // HSDP: replica group 0's (Note [hsdp]).
    if (!reading && !MeshPlan::first_of(mesh_.groups.data_replicate)) return held;
    // Every rank its shards' spans of the parameters and of their state
    // (Note [fsdp optimizer state]); AdamW's step, the same in every shard,
    // by the rank whose span starts the parameter. Under tp a cut
    // parameter's spans by every tp rank, as runs of the whole (Note [fsdp
    // x tp checkpoints]), a whole one's by the first.
    const auto spans = fsdp->shard_spans();
    const auto& shards = fsdp->parameters();
    for (size_t i = 0; i < spans.size(); ++i) {
      if (spans[i].empty()) continue;
      const auto& first = fsdp->model_parameters()[spans[i][0].parameter];
      const auto state = state_of(shards[i], name_of(parameter_names, first));
      for (const auto& span : spans[i]) {
        const auto& p = fsdp->model_parameters()[span.parameter];
        const dist::Placement* cut = mesh_.cut(p);
        if (!cut && !first_part) continue;
        auto add = [&](const Named& named, const torch::Tensor& run) {
          if (cut) {
            add_run_pieces(pieces, named, span, *cut, mesh_.groups.tensor->rank(), mesh_.groups.tensor->size(), run);
          } else {
            pieces.push_back({named.name, named.order, span.shape, span.strides, span.offset, run});
          }
        };
        add(name_of(names, p), dist::in_memory_order(shards[i].detach()).narrow(0, span.shard_offset, span.numel));
        const auto& base = name_of(parameter_names, p);
        for (size_t slot = 0; slot < state.size(); ++slot) {
          const auto& [key, t] = state[slot];
          const Named named{base.name + key, base.order + static_cast<int64_t>(slot)};
          if (t.dim() == 0) {
            if (reading || (span.offset == 0 && first_part)) pieces.push_back(whole_piece(named, t));
            continue;
          }
          add(named, dist::in_memory_order(t).narrow(0, span.shard_offset, span.numel));
        }
      }
    }
    return held;
  }
  // Replicated weights from the first replica; the optimizer's state from
  // its owner under --shard-optimizer (Note [sharded optimizer state]).
  // A resume fills a weight tied across stages on the copy's rank too
  // (both step it: Note [tied weights across stages]).
  const auto* zero = dynamic_cast<const optim::ShardedState*>(&optimizer);
  std::vector<torch::Tensor> parameters;
  for (auto* module : mine) {
    for (const auto& p : module->parameters()) parameters.push_back(p);
  }
  if (reading && mesh_.tied) {
    for (const auto& p : mesh_.tied->borrowed()) parameters.push_back(p);
  }
  // Under ep (Note [expert checkpoints]): an expert weight is written by
  // the first of the ranks holding the same experts, its step count (the
  // same in every rank's slice) by the first of the ep group too.
  const bool first_experts = reading || MeshPlan::first_of(mesh_.groups.expert_replicate);
  const bool first_of_ep = reading || MeshPlan::first_of(mesh_.groups.expert);
  for (const auto& p : parameters) {
    const dist::Placement* cut = mesh_.cut(p);
    if (mesh_.spreads(p)) {
      if (!first_experts) continue;
      const int64_t ep_rank = mesh_.groups.expert->rank(), ep = mesh_.groups.expert->size();
      auto add = [&](const Named& named, const torch::Tensor& t) {
        if (t.sizes() != p.sizes()) {  // AdamW's step
          if (first_of_ep && first_part) pieces.push_back(whole_piece(named, t));
        } else if (cut || first_part) {
          add_expert_pieces(pieces, named, t, ep_rank * p.size(0), ep * p.size(0), cut,
                            cut ? mesh_.groups.tensor->rank() : 0, cut ? mesh_.groups.tensor->size() : 1,
                            reading ? &held.write_backs : nullptr);
        }
      };
      add(name_of(names, p), p);
      const auto& base = name_of(parameter_names, p);
      int64_t slot = 0;
      for (const auto& [key, t] : state_of(p, base)) add({base.name + key, base.order + slot++}, t);
      continue;
    }
    auto add = [&](const Named& named, const torch::Tensor& t) {
      if (cut && t.sizes() == p.sizes()) {
        add_cut_pieces(pieces, named, t, *cut, mesh_.groups.tensor->rank(), mesh_.groups.tensor->size(),
                       reading ? &held.write_backs : nullptr);
      } else if (first_part) {
        pieces.push_back(whole_piece(named, t));
      }
    };
    if (first_replica) add(name_of(names, p), p);
    const bool owns_state = zero ? zero->owner(p) == zero->rank() : first_replica;
    if (!owns_state) continue;
    const auto& base = name_of(parameter_names, p);
    int64_t slot = 0;
    for (const auto& [key, t] : state_of(p, base)) add({base.name + key, base.order + slot++}, t);
  }
  return held;
}

}  // namespace tandem::engine
