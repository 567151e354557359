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
      for (size_t k = 0; k < unit->parameters.size(); ++k) {
        const int64_t numel = unit->shard_numel(k, fsdp_.rank_);
        unit->own_chunk(unit->block, k).narrow(0, 0, numel).copy_(
            unit->rows(unit->full, k).view({-1}).narrow(0, unit->shard_start(k, fsdp_.rank_), numel));
      }
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
  for (auto& unit : units_) {
    if (unit->empty()) continue;
    // This rank's block of them, all-gathered, each parameter's rows put whole.
    auto block = torch::zeros({unit->layout.shard}, shard_like[unit->parameters[0]].options());
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      const auto& part = shard_like[unit->parameters[k]];
      const auto shape = unit->shard_shape(k, rank_);
      TANDEM_CHECK(part.sizes() == c10::IntArrayRef(shape), "FullyShardedDataParallel: a tensor of shape ",
                   part.sizes(), " in place of a shard of shape ", c10::IntArrayRef(shape));
      unit->shard_of(block, k, rank_).copy_(part);
    }
    auto gathered = torch::empty({unit->layout.padded}, block.options());
    auto chunks = gathered.chunk(world_);
    std::vector<torch::Tensor> outputs(chunks.begin(), chunks.end());
    gather_group_->all_gather(outputs, block).wait();
    auto flat = torch::empty({unit->layout.padded}, block.options());
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      unit->rows(flat, k).copy_(unit->chunks(gathered, k));
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
  std::vector<torch::Tensor> shards(parameters_.size());
  for (const auto& unit : units_) {
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      const auto& t = full[unit->parameters[k]];
      TANDEM_CHECK(t.sizes() == c10::IntArrayRef(unit->shapes[k]), "FullyShardedDataParallel: a tensor of shape ",
                   t.sizes(), " in place of a parameter of shape ", c10::IntArrayRef(unit->shapes[k]));
      // Its rows, strided as the shard is.
      auto shard = torch::empty_strided(unit->shard_shape(k, rank_), unit->shard_strides(k), t.options());
      shard.copy_((t.dim() == 0 ? t.reshape({1}) : t)
                      .narrow(0, unit->layout.first_row(k, rank_), unit->layout.rows_of(k, rank_)));
      shards[unit->parameters[k]] = shard;
    }
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
  std::vector<std::vector<ShardSpan>> spans(shards_.size());
  for (const auto& unit : units_) {
    for (size_t k = 0; k < unit->parameters.size(); ++k) {
      const int64_t numel = unit->shard_numel(k, rank_);
      if (numel == 0) continue;
      spans[unit->parameters[k]].push_back(
          {unit->parameters[k], unit->shard_start(k, rank_), numel, 0, unit->shapes[k], unit->strides[k]});
    }
  }
  return spans;
}

}  // namespace tandem::parallel
