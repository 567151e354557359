// Note [tensor-parallel plans] (tensor_parallel_plan.h).
#include "tandem/parallel/tensor_parallel_plan.h"

#include <algorithm>
#include <functional>
#include <map>

#include <torch/torch.h>

#include "tandem/models/gpt2.h"
#include "tandem/models/llama.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::parallel {

void check_divides_heads(int64_t size, const std::string& what, int64_t world) {
  TANDEM_CHECK(size % world == 0, "tensor parallelism: ", world, " ranks do not divide the model's ", size, " ", what,
               " (tp must divide the attention's heads)");
}
namespace {

torch::Tensor range(int64_t begin, int64_t end) { return torch::arange(begin, end, torch::kInt64); }

// Per rank: its part of `size` rows (torch.chunk's cut).
std::vector<torch::Tensor> chunk_rows(int64_t size, int64_t world) {
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < world; ++r) {
    const auto part = tp::part_of(size, r, world);
    rows.push_back(range(part.begin, part.end));
  }
  return rows;
}

// Per rank: the rows of its heads (of `width` each) in each of `blocks`
// consecutive blocks of `heads * width` rows (GPT-2's fused q, k, v).
std::vector<torch::Tensor> head_rows(int64_t heads, int64_t width, int64_t blocks, int64_t world) {
  std::vector<torch::Tensor> rows;
  for (int64_t r = 0; r < world; ++r) {
    const auto part = tp::part_of(heads, r, world);
    std::vector<torch::Tensor> pieces;
    for (int64_t b = 0; b < blocks; ++b) {
      pieces.push_back(range(b * heads * width + part.begin * width, b * heads * width + part.end * width));
    }
    rows.push_back(torch::cat(pieces));
  }
  return rows;
}

}  // namespace

void TensorParallelPlan::cut_parameter(torch::Tensor& p, int64_t dim, std::vector<torch::Tensor> indices) {
  auto cut = dist::Placement::shard(dim, p.size(dim), std::move(indices));
  torch::NoGradGuard no_grad;
  p.set_data(dist::part_of_whole(p.detach(), cut, *group_).contiguous());
  cuts_[p.unsafeGetTensorImpl()] = std::move(cut);
}

TensorParallelPlan::TensorParallelPlan(models::Sequence model, std::shared_ptr<dist::ProcessGroup> group,
                                       TensorParallelPlanOptions options)
    : model_(std::move(model)), group_(std::move(group)), options_(options) {
  TANDEM_CHECK(!model_.is_empty() && group_, "TensorParallelPlan: a model and a group are required");
  const int64_t world = group_->size();
  auto g = group_;
  // Note [sequence-parallel plans]: the batch is [B, T, ...], the sequence dim 1.
  models::TensorMap enter = [g](const torch::Tensor& x) { return tp::copy_to(x, *g); };
  models::TensorMap leave = [g](const torch::Tensor& x) { return tp::reduce_from(x, *g); };
  if (options_.sequence_parallel) {
    enter = [g](const torch::Tensor& x) { return tp::gather_sequence(x, *g, 1); };
    leave = [g](const torch::Tensor& x) { return tp::reduce_scatter_sequence(x, *g, 1); };
  }
  // A region's hooks, and the part of its heads and (under sequence
  // parallelism) of its output's positions this rank holds.
  auto region = [&] {
    models::SplitRegion r{enter, leave};
    r.rank = group_->rank();
    r.parts = world;
    r.sequence = options_.sequence_parallel;
    return r;
  };
  auto divides = [&](int64_t heads, const char* what) { check_divides_heads(heads, what, world); };
  // Every refusal first, before any parameter is cut.
  for (const auto& module : model_->modules(/*include_self=*/false)) {
    if (auto* a = dynamic_cast<models::Gpt2AttentionImpl*>(module.get())) {
      divides(a->config().n_head, "heads");
    }
    if (auto* a = dynamic_cast<models::LlamaAttentionImpl*>(module.get())) {
      divides(a->config().num_heads, "heads");
      divides(a->config().num_kv_heads, "key/value heads");
    }
  }
  int64_t blocks = 0, heads = 0;
  torch::Tensor* embedding = nullptr;
  // The embedding by vocabulary rows, its lookup summed over the ranks.
  auto cut_embedding = [&](torch::Tensor& weight, models::SplitLookup& split) {
    embedding = &weight;
    vocab_size_ = weight.size(0);
    cut_parameter(weight, 0, chunk_rows(vocab_size_, world));
    split = {tp::part_of(vocab_size_, group_->rank(), world).begin, leave};
    if (options_.sequence_parallel) {
      split.sequence_rank = group_->rank();
      split.sequence_parts = world;
    }
    lookups_.push_back(&split);
  };
  for (const auto& module : model_->modules(/*include_self=*/false)) {
    if (auto* a = dynamic_cast<models::Gpt2AttentionImpl*>(module.get())) {
      const int64_t h = a->config().n_head, d = a->config().n_embd / h;
      cut_parameter(a->c_attn->weight, 1, head_rows(h, d, 3, world));
      cut_parameter(a->c_attn->bias, 0, head_rows(h, d, 3, world));
      cut_parameter(a->c_proj->weight, 0, head_rows(h, d, 1, world));
      a->split = region();
      regions_.push_back(&a->split);
      ++blocks;
      heads = h;
    } else if (auto* m = dynamic_cast<models::Gpt2MlpImpl*>(module.get())) {
      const auto rows = chunk_rows(m->c_fc->weight.size(1), world);
      cut_parameter(m->c_fc->weight, 1, rows);
      cut_parameter(m->c_fc->bias, 0, rows);
      cut_parameter(m->c_proj->weight, 0, rows);
      m->split = region();
      regions_.push_back(&m->split);
    } else if (auto* e = dynamic_cast<models::Gpt2EmbeddingImpl*>(module.get())) {
      cut_embedding(e->wte->weight, e->split);
    } else if (auto* head = dynamic_cast<models::Gpt2HeadImpl*>(module.get())) {
      head->split.enter = enter;  // its tied weight is the embedding's, cut by vocabulary
      regions_.push_back(&head->split);
    } else if (auto* a = dynamic_cast<models::LlamaAttentionImpl*>(module.get())) {
      const auto& c = a->config();
      const int64_t d = c.head_dim();
      cut_parameter(a->q_proj->weight, 0, head_rows(c.num_heads, d, 1, world));
      cut_parameter(a->k_proj->weight, 0, head_rows(c.num_kv_heads, d, 1, world));
      cut_parameter(a->v_proj->weight, 0, head_rows(c.num_kv_heads, d, 1, world));
      if (c.qkv_bias) {  // by heads, as their weights' rows; o_proj's bias whole (added once)
        cut_parameter(a->q_proj->bias, 0, head_rows(c.num_heads, d, 1, world));
        cut_parameter(a->k_proj->bias, 0, head_rows(c.num_kv_heads, d, 1, world));
        cut_parameter(a->v_proj->bias, 0, head_rows(c.num_kv_heads, d, 1, world));
      }
      cut_parameter(a->o_proj->weight, 1, head_rows(c.num_heads, d, 1, world));
      if (a->q_norm) {  // each rank normalises its heads with the whole weight
        partial_.insert(a->q_norm->weight.unsafeGetTensorImpl());
        partial_.insert(a->k_norm->weight.unsafeGetTensorImpl());
      }
      a->split = region();
      regions_.push_back(&a->split);
      ++blocks;
      heads = c.num_heads;
    } else if (auto* m = dynamic_cast<models::LlamaMlpImpl*>(module.get())) {
      const auto rows = chunk_rows(m->gate_proj->weight.size(0), world);
      cut_parameter(m->gate_proj->weight, 0, rows);
      cut_parameter(m->up_proj->weight, 0, rows);
      cut_parameter(m->down_proj->weight, 1, rows);
      if (m->gate_proj->bias.defined()) {  // down_proj's bias whole (added once)
        cut_parameter(m->gate_proj->bias, 0, rows);
        cut_parameter(m->up_proj->bias, 0, rows);
      }
      m->split = region();
      regions_.push_back(&m->split);
    } else if (auto* m = dynamic_cast<models::SparseMoeImpl*>(module.get())) {
      // Every expert by features, as the MLP; the router whole, its
      // gradient a partial sum (each rank's experts' share of each weight).
      auto& e = *m->experts;
      const auto rows = chunk_rows(e.gate_proj.size(1), world);
      cut_parameter(e.gate_proj, 1, rows);
      cut_parameter(e.up_proj, 1, rows);
      cut_parameter(e.down_proj, 2, rows);
      partial_.insert(m->gate->weight.unsafeGetTensorImpl());
      m->split = region();
      regions_.push_back(&m->split);
    } else if (auto* e = dynamic_cast<models::LlamaEmbeddingImpl*>(module.get())) {
      cut_embedding(e->embed_tokens->weight, e->split);
    } else if (auto* head = dynamic_cast<models::LlamaHeadImpl*>(module.get())) {
      if (head->lm_head) cut_parameter(head->lm_head->weight, 0, chunk_rows(head->lm_head->weight.size(0), world));
      head->split.enter = enter;
      regions_.push_back(&head->split);
    }
  }
  TANDEM_CHECK(blocks > 0 && embedding != nullptr, "tensor parallelism: the model has no tensor-parallel plan (only "
               "GPT-2 and LLaMA models have one)");
  vocabulary_ = tp::part_of(vocab_size_, group_->rank(), world);
  description_ = format("tensor parallel over %lld ranks: each block's attention by %lld of %lld heads and its MLP (or "
                        "experts) by features, the vocabulary's %lld rows by %lld (this rank: %lld..%lld)%s",
                        static_cast<long long>(world), static_cast<long long>(heads / world),
                        static_cast<long long>(heads), static_cast<long long>(vocab_size_),
                        static_cast<long long>(world), static_cast<long long>(vocabulary_.begin),
                        static_cast<long long>(vocabulary_.end - 1),
                        options_.sequence_parallel ? "; sequence parallel between them" : "");
}

dist::Placement TensorParallelPlan::gradient_placement(const torch::Tensor& parameter) const {
  const auto& placement = cut(parameter);
  if (placement.is_shard()) return placement;
  const bool partial = sequence_parallel() || (!detached_ && partial_.count(parameter.unsafeGetTensorImpl()) > 0);
  return partial ? dist::Placement::partial() : placement;
}

void TensorParallelPlan::reduce_gradients() {
  std::vector<dist::PlacedTensor> pieces;
  for (const auto& p : model_->parameters()) {
    dist::PlacedTensor t{"", p, p};
    t.tensor_parallel = gradient_placement(p);
    pieces.push_back(std::move(t));
  }
  // One all-reduce of them all (every rank holds the same parameters, in
  // the same order, each with or without a gradient alike).
  dist::sum_partial_gradients(pieces, &dist::PlacedTensor::tensor_parallel, *group_);
}

void TensorParallelPlan::make_whole(torch::optim::Optimizer* optimizer) {
  TANDEM_CHECK(!detached_ && held_parts_.empty(), "TensorParallelPlan: make_whole() after detach() or twice");
  torch::NoGradGuard no_grad;
  for (auto& p : model_->parameters()) {
    if (!cut(p).is_shard()) continue;
    const auto part_shape = p.sizes().vec();
    const auto part = p.detach();
    held_parts_.push_back(part);
    p.set_data(whole_of_part(p, part));
    if (optimizer) optim::map_parameter_state(*optimizer, p, part_shape, [&](const torch::Tensor& t) { return whole_of_part(p, t); });
  }
}

void TensorParallelPlan::cut_again(torch::optim::Optimizer* optimizer) {
  TANDEM_CHECK(!detached_, "TensorParallelPlan: cut_again() after detach()");
  torch::NoGradGuard no_grad;
  size_t next = 0;
  for (auto& p : model_->parameters()) {
    if (!cut(p).is_shard()) continue;
    TANDEM_CHECK(next < held_parts_.size(), "TensorParallelPlan: cut_again() without make_whole()");
    const auto whole_shape = p.sizes().vec();
    auto part = held_parts_[next++];
    part.copy_(part_of_whole(p, p.detach()));
    p.set_data(part);
    if (optimizer) {
      optim::map_parameter_state(*optimizer, p, whole_shape, [&](const torch::Tensor& t) { return part_of_whole(p, t).contiguous(); });
    }
  }
  held_parts_.clear();
}

void TensorParallelPlan::detach() {
  TANDEM_CHECK(!detached_, "TensorParallelPlan: detach() twice");
  torch::NoGradGuard no_grad;
  for (auto& p : model_->parameters()) {  // every rank in the same order: the collectives pair up
    if (cut(p).is_shard()) p.set_data(whole_of_part(p, p.detach()));
  }
  for (auto* region : regions_) *region = {};
  for (auto* lookup : lookups_) *lookup = {};
  detached_ = true;
}

const dist::Placement& TensorParallelPlan::cut(const torch::Tensor& parameter) const {
  auto found = cuts_.find(parameter.unsafeGetTensorImpl());
  return detached_ || found == cuts_.end() ? whole_ : found->second;
}

torch::Tensor TensorParallelPlan::part_of_whole(const torch::Tensor& parameter, const torch::Tensor& whole) const {
  return dist::part_of_whole(whole, cut(parameter), *group_);
}

torch::Tensor TensorParallelPlan::whole_of_part(const torch::Tensor& parameter, const torch::Tensor& part) const {
  return dist::whole_of_part(part, cut(parameter), *group_);
}

}  // namespace tandem::parallel
