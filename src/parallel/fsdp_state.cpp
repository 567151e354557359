// FSDP's whole parameters and state (fsdp.h): FullParams, and tensors
// shaped like the shards gathered into the parameters' shapes and back.
#include "tandem/parallel/fsdp.h"

#include <algorithm>

#include <torch/torch.h>

#include "tandem/util/check.h"
#include "fsdp_unit.h"

namespace tandem::parallel {

FullyShardedDataParallel::FullParams::FullParams(FullyShardedDataParallel& fsdp, bool write_back)
    : fsdp_(fsdp), write_back_(write_back) {
  for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.gather(u);
  for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.wait_gathered(u);
  ++fsdp_.full_params_depth_;
}

FullyShardedDataParallel::FullParams::~FullParams() {
  torch::NoGradGuard no_grad;
  if (write_back_) {
    for (auto& unit : fsdp_.units_) {
      if (unit->empty()) continue;
      unit->shard.copy_(unit->full.narrow(0, fsdp_.rank_ * unit->layout.shard, unit->layout.shard));
    }
  }
  if (--fsdp_.full_params_depth_ == 0) {
    for (size_t u = 0; u < fsdp_.units_.size(); ++u) fsdp_.release(u);
  }
}

std::vector<torch::Tensor> FullyShardedDataParallel::gather_like_parameters(
    const std::vector<torch::Tensor>& shard_like) {
  TANDEM_CHECK(shard_like.size() == shards_.size(), "FullyShardedDataParallel: expected ",
               shards_.size(), " tensors shaped like the shards, got ", shard_like.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> full(parameters_.size());
  size_t next = 0;
  for (auto& unit : units_) {
    if (unit->empty()) continue;
    const auto& part = shard_like[next++];
    TANDEM_CHECK(part.numel() == unit->layout.shard, "FullyShardedDataParallel: a tensor of ",
                 part.numel(), " elements in place of a shard of ", unit->layout.shard);
    auto flat = torch::empty({unit->layout.padded}, part.options());
    auto chunks = flat.chunk(world_);
    std::vector<torch::Tensor> outputs(chunks.begin(), chunks.end());
    gather_group_->all_gather(outputs, part.reshape({-1}).contiguous()).wait();
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      full[unit->parameters[k]] = unit->slot(flat, k).clone(torch::MemoryFormat::Preserve);
    }
  }
  return full;
}

std::vector<torch::Tensor> FullyShardedDataParallel::shard_like_parameters(
    const std::vector<torch::Tensor>& full) const {
  TANDEM_CHECK(full.size() == parameters_.size(), "FullyShardedDataParallel: expected ",
               parameters_.size(), " tensors shaped like the parameters, got ", full.size());
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> shards;
  for (const auto& unit : units_) {
    if (unit->empty()) continue;
    auto flat = torch::zeros({unit->layout.padded}, full[unit->parameters[0]].options());
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      const auto& t = full[unit->parameters[k]];
      TANDEM_CHECK(t.sizes() == c10::IntArrayRef(unit->shapes[k]), "FullyShardedDataParallel: a tensor of shape ",
                   t.sizes(), " in place of a parameter of shape ", c10::IntArrayRef(unit->shapes[k]));
      unit->slot(flat, k).copy_(t);
    }
    shards.push_back(flat.narrow(0, rank_ * unit->layout.shard, unit->layout.shard).clone());
  }
  return shards;
}

std::vector<std::vector<int64_t>> FullyShardedDataParallel::parameter_shapes() const {
  std::vector<std::vector<int64_t>> shapes(parameters_.size());
  for (const auto& unit : units_) {
    for (size_t k = 0; k < unit->parameters.size(); ++k) shapes[unit->parameters[k]] = unit->shapes[k];
  }
  return shapes;
}

std::vector<std::vector<FullyShardedDataParallel::ShardSpan>> FullyShardedDataParallel::shard_spans() const {
  std::vector<std::vector<ShardSpan>> spans;
  for (const auto& unit : units_) {
    if (unit->empty()) continue;
    const int64_t lo = rank_ * unit->layout.shard, hi = lo + unit->layout.shard;
    auto& mine = spans.emplace_back();
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      const int64_t begin = unit->layout.offsets[k];
      const int64_t end = begin + c10::multiply_integers(unit->shapes[k]);
      const int64_t from = std::max(begin, lo), to = std::min(end, hi);
      if (from >= to) continue;
      mine.push_back({unit->parameters[k], from - begin, to - from, from - lo, unit->shapes[k], unit->strides[k]});
    }
  }
  return spans;
}

}  // namespace tandem::parallel
