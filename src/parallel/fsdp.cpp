#include "tandem/parallel/fsdp.h"

#include <algorithm>
#include <functional>
#include <unordered_set>

#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/models/activation_checkpoint.h"
#include "tandem/util/check.h"
#include "fsdp_unit.h"

namespace tandem::parallel {

namespace {

struct UnitGradientReadyHook : torch::autograd::FunctionPostHook {
  UnitGradientReadyHook(FullyShardedDataParallel* fsdp, size_t index) : fsdp_(fsdp), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fsdp_->gradient_ready(index_);
    return outputs;
  }
  FullyShardedDataParallel* fsdp_;
  size_t index_;
};

// The strides a parameter keeps inside the full buffer: its own when they
// are dense with dim 0 outermost (channels-last weights stay channels-last),
// else contiguous. Dim 0 outermost makes a shard's rows one run of memory.
std::vector<int64_t> flat_strides(const torch::Tensor& p) {
  if (p.dim() == 0) return {};
  if (p.is_non_overlapping_and_dense() && p.stride(0) * std::max<int64_t>(p.size(0), 1) == std::max<int64_t>(p.numel(), 1)) {
    return p.strides().vec();
  }
  std::vector<int64_t> strides(p.dim());
  int64_t stride = 1;
  for (int64_t d = p.dim() - 1; d >= 0; --d) {
    strides[d] = stride;
    stride *= std::max<int64_t>(p.size(d), 1);
  }
  return strides;
}

// Note [fully sharded parameters]: a unit's buffer, the parameters while
// gathered, and the views of them that autograd saved in forward (a
// Linear's weight.t()) share one StorageImpl, so releasing its memory (and
// allocating it again before the next gather) reaches them all while the
// tensors themselves, and autograd's references to them, stay.
void release_storage(const torch::Tensor& t) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(c10::DataPtr(nullptr, t.device()));
  storage->set_nbytes(0);
}

void allocate_storage(const torch::Tensor& t, size_t nbytes) {
  auto* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

}  // namespace

FullyShardedDataParallel::FullyShardedDataParallel(models::Sequence model,
                                                   std::shared_ptr<dist::ProcessGroup> group,
                                                   FsdpOptions options)
    : model_(std::move(model)), group_(std::move(group)), options_(options) {
  TANDEM_CHECK(!model_.is_empty() && group_, "FullyShardedDataParallel: a model and a group are required");
  rank_ = group_->rank();
  world_ = group_->size();
  for (const auto& p : model_->named_parameters()) {
    TANDEM_CHECK(p.value().requires_grad(), "FullyShardedDataParallel: parameter '", p.key(),
                 "' does not require a gradient; FSDP shards trainable parameters only (freeze "
                 "nothing, or train that part without FSDP)");
  }
  // Note [fsdp layers]: the model's layers, a nested Sequence opened up.
  std::function<void(const models::SequenceImpl&, const std::string&)> open_up =
      [&](const models::SequenceImpl& sequence, const std::string& prefix) {
        for (size_t i = 0; i < sequence.size(); ++i) {
          const auto& module = sequence.at(i);
          const std::string name = prefix + sequence.name(i);
          auto nested = std::dynamic_pointer_cast<models::SequenceImpl>(module.ptr());
          if (nested && nested->checkpointed_segments().empty()) {
            open_up(*nested, name + ".");
          } else {
            layers_.push_back(module);
            layer_names_.push_back(name);
          }
        }
      };
  open_up(*model_, "");
  std::vector<int64_t> layer_numels;
  std::vector<std::vector<torch::Tensor>> layer_parameters;
  for (const auto& layer : layers_) {
    layer_parameters.push_back(layer.ptr()->parameters());
    int64_t numel = 0;
    for (const auto& p : layer_parameters.back()) numel += p.numel();
    layer_numels.push_back(numel);
  }
  plans_ = plan_units(layer_numels, options_.min_unit_numel);
  for (const auto& plan : plans_) {
    unit_buffers_.emplace_back();
    for (size_t layer = plan.begin; layer < plan.end; ++layer) {
      for (const auto& b : layers_[layer].ptr()->buffers()) unit_buffers_.back().push_back(b);
    }
  }

  // Everything that can be refused is checked before any collective, so
  // that every rank refuses alike before making (and at once destroying)
  // groups of its own.
  for (const auto& plan : plans_) {
    const torch::Tensor* first = nullptr;
    for (size_t layer = plan.begin; layer < plan.end; ++layer) {
      for (const auto& p : layer_parameters[layer]) {
        if (first == nullptr) first = &p;
        TANDEM_CHECK(p.device() == first->device() && p.scalar_type() == first->scalar_type(),
                     "FullyShardedDataParallel: layer '", layer_names_[layer], "' has a parameter of ",
                     p.scalar_type(), " on ", p.device(), ", unlike the rest of its unit (",
                     first->scalar_type(), " on ", first->device(), "); a unit is gathered as one buffer");
      }
    }
  }
  // Note [fsdp tied weights]: the parameters some layer reads besides its owner.
  std::unordered_set<const c10::TensorImpl*> tied;
  for (size_t layer = 0; layer < layers_.size(); ++layer) {
    for (const auto& module : layers_[layer].ptr()->modules(/*include_self=*/true)) {
      const auto* user = dynamic_cast<const models::TiedWeightUser*>(module.get());
      if (user == nullptr || !user->tied().defined()) continue;
      const auto* impl = user->tied().unsafeGetTensorImpl();
      bool owned = false;
      for (const auto& ps : layer_parameters) {
        for (const auto& p : ps) owned = owned || p.unsafeGetTensorImpl() == impl;
      }
      TANDEM_CHECK(owned || options_.foreign_tied_weights, "FullyShardedDataParallel: layer '", layer_names_[layer],
                   "' reads a tied weight that is not a parameter of the sharded model (its owner is elsewhere: "
                   "another pipeline stage?)");
      if (owned) tied.insert(impl);
    }
  }
  dist::check_same_parameters(*model_, *group_, "FullyShardedDataParallel");
  dist::broadcast_module(*model_, *group_, 0);
  // Note [fsdp collective order]
  gather_group_ = group_->duplicate("fsdp-gather");
  reduce_group_ = group_->duplicate("fsdp-reduce");

  torch::NoGradGuard no_grad;
  for (const auto& plan : plans_) {
    auto unit = std::make_unique<Unit>();
    unit->plan = plan;
    for (size_t layer = plan.begin; layer < plan.end; ++layer) {
      for (auto& p : layer_parameters[layer]) {
        unit->pinned = unit->pinned || tied.count(p.unsafeGetTensorImpl()) != 0;
        unit->parameters.push_back(parameters_.size());
        unit_of_.push_back(units_.size());
        parameters_.push_back(p);
        unit->shapes.push_back(p.sizes().vec());
        unit->strides.push_back(flat_strides(p));
      }
    }
    unit->layout = plan_shards(unit->shapes, world_);
    if (!unit->empty()) {
      const auto& first = parameters_[unit->parameters[0]];
      const auto options = first.options().requires_grad(false);
      unit->full = torch::zeros({unit->layout.padded}, options);
      unit->block = torch::zeros({unit->layout.shard}, options);
      for (size_t k = 0; k < unit->parameters.size(); ++k) {
        unit->slot(unit->full, k).copy_(parameters_[unit->parameters[k]]);
        unit->own_chunk(unit->block, k).copy_(unit->rows(unit->full, k)[rank_]);
        auto shard = unit->shard_of(unit->block, k, rank_);  // Note [fully sharded parameters]
        shard.set_requires_grad(true);
        shards_.push_back(shard);
      }
      unit->at_rest = torch::empty({0}, first.options().requires_grad(false));
      unit->allocated = true;
    }
    units_.push_back(std::move(unit));
  }
  // Each gradient's hook, once nothing can throw any more (a hook left on a
  // model whose FSDP failed to construct, by a failed collective say, would
  // call into nothing), and while the parameters still have their shapes (the accumulator records
  // the shape its gradients must have).
  for (size_t k = 0; k < parameters_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[k]);
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<UnitGradientReadyHook>(this, k)));
    accumulators_.push_back(std::move(accumulator));
  }
  for (size_t u = 0; u < units_.size(); ++u) release(u);
}

FullyShardedDataParallel::~FullyShardedDataParallel() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

void FullyShardedDataParallel::detach_model() {
  TANDEM_CHECK(!detached_, "FullyShardedDataParallel: detach_model() twice");
  {
    FullParams full(*this, /*write_back=*/false);
    torch::NoGradGuard no_grad;
    for (auto& unit : units_) {
      for (size_t k = 0; k < unit->parameters.size(); ++k) {
        parameters_[unit->parameters[k]].set_data(unit->slot(unit->full, k).clone(torch::MemoryFormat::Preserve));
      }
    }
    detached_ = true;  // release() below leaves the parameters alone
  }
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
  accumulators_.clear();
  hook_keys_.clear();
}

std::string FullyShardedDataParallel::describe_units() const {
  std::string text;
  for (const auto& plan : plans_) {
    if (!text.empty()) text += " | ";
    text += layer_names_[plan.begin];
    if (plan.end - plan.begin > 1) text += ".." + layer_names_[plan.end - 1];
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->pinned) text += " (unit " + std::to_string(u + 1) + " holds a tied weight: kept gathered)";
  }
  return text;
}

int64_t FullyShardedDataParallel::gathered_units() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u->allocated ? 1 : 0;
  return n;
}

void FullyShardedDataParallel::gather(size_t index) {
  auto& unit = *units_[index];
  if (unit.empty() || unit.allocated) return;
  allocate_storage(unit.full, unit.nbytes());
  unit.allocated = true;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < unit.parameters.size(); ++k) {
    parameters_[unit.parameters[k]].set_data(unit.slot(unit.full, k));  // the same tensor, its values
  }
  // Note [fsdp shards]: the ranks' blocks, copied into the full buffer when waited for.
  unit.gathered = torch::empty({unit.layout.padded}, unit.block.options());
  auto chunks = unit.gathered.chunk(world_);
  std::vector<torch::Tensor> outputs(chunks.begin(), chunks.end());
  unit.gather_work = gather_group_->all_gather(outputs, unit.block);
  unit.gathering = true;
}

void FullyShardedDataParallel::wait_gathered(size_t index) {
  gather(index);
  auto& unit = *units_[index];
  if (!unit.gathering) return;
  unit.gather_work.wait();
  unit.gather_work = dist::Work();  // it holds the gathered blocks, which go now
  unit.gathering = false;
  torch::NoGradGuard no_grad;
  for (size_t k = 0; k < unit.parameters.size(); ++k) unit.rows(unit.full, k).copy_(unit.chunks(unit.gathered, k));
  unit.gathered = torch::Tensor();
}

void FullyShardedDataParallel::release(size_t index) {
  auto& unit = *units_[index];
  if (unit.empty() || !unit.allocated) return;
  if (unit.gathering) {  // a prefetch nobody used: the buffer is being written
    unit.gather_work.wait();
    unit.gather_work = dist::Work();
    unit.gathering = false;
    unit.gathered = torch::Tensor();
  }
  release_storage(unit.full);
  unit.allocated = false;
  if (detached_) return;  // the parameters have memory of their own now
  torch::NoGradGuard no_grad;
  for (size_t k : unit.parameters) parameters_[k].set_data(unit.at_rest);  // no elements at rest
}

torch::Tensor FullyShardedDataParallel::forward(const torch::Tensor& input) {
  TANDEM_CHECK(!detached_, "FullyShardedDataParallel: forward() after detach_model()");
  const bool training = model_->is_training();
  const bool graph = training && torch::GradMode::is_enabled();
  // The step's first forward in training (none since the last after_backward()).
  const bool first_of_step = !in_backward_;
  if (training && first_of_step && options_.broadcast_buffers && world_ > 1) {
    dist::broadcast_buffers(*model_, *group_, 0);
  }
  if (graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    // A backward that has run since the last forward: the units it left
    // incomplete (parameters without gradients) are reduced now, so that
    // the next backward starts afresh (gradient accumulation).
    bool any = std::any_of(seen_.begin(), seen_.end(), [](bool b) { return b; });
    if (in_backward_ && any) {
      std::fill(missing_.begin(), missing_.end(), 0);
      launch_reductions(/*pinned_too=*/true);
    }
    missing_.assign(units_.size(), 0);
    for (size_t u = 0; u < units_.size(); ++u) missing_[u] = static_cast<int64_t>(units_[u]->parameters.size());
    seen_.assign(parameters_.size(), false);
    reduced_down_to_ = units_.size();
    in_backward_ = true;
  }
  // Note [fsdp tied weights]: a pinned unit is there for every unit's forward.
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->pinned) wait_gathered(u);
  }
  torch::Tensor x = input;
  for (size_t u = 0; u < units_.size(); ++u) {
    wait_gathered(u);
    if (options_.prefetch && u + 1 < units_.size()) gather(u + 1);  // Note [fsdp prefetch]
    const auto& plan = units_[u]->plan;
    auto run = [this, begin = plan.begin, end = plan.end](const torch::Tensor& in) {
      torch::Tensor y = in;
      for (size_t layer = begin; layer < end; ++layer) y = layers_[layer].forward(y);
      return y;
    };
    // (A unit with no parameters fed data that needs no gradient has no backward to recompute for.)
    const bool has_backward = !units_[u]->empty() || x.requires_grad();
    if (graph && options_.checkpoint_activations && u + 1 < units_.size() && has_backward) {
      // Note [fsdp activation checkpointing]: on a copy of the input, which
      // the unit's first layer may change in place (an in-place ReLU).
      x = models::checkpoint_activations([run](const torch::Tensor& in) { return run(in.clone()); }, x,
                                         unit_buffers_[u]);
    } else {
      x = run(x);
    }
    if (graph && !units_[u]->empty() && x.requires_grad()) {
      // Before the unit's own backward: gather it again (a pre-hook of the
      // node that made x, which stays the same if x is later changed in place).
      x.register_hook([this, u](const torch::Tensor&) { before_unit_backward(u); });
    }
    // The last unit's backward comes first: it stays.
    const bool keep = units_[u]->pinned || (graph && (!options_.reshard_after_forward || u + 1 == units_.size()));
    if (!keep) release(u);
  }
  if (!graph) {  // evaluation: the pinned units' use is over
    for (size_t u = 0; u < units_.size(); ++u) {
      if (units_[u]->pinned) release(u);
    }
  }
  return x;
}

void FullyShardedDataParallel::before_unit_backward(size_t index) {
  wait_gathered(index);
  {
    // Note [fsdp gradients in place]
    std::lock_guard<std::mutex> lock(mutex_);
    auto& unit = *units_[index];
    if (in_backward_ && !unit.empty() && !unit.grad_flat.defined() && index < reduced_down_to_) {
      torch::NoGradGuard no_grad;
      unit.grad_flat = torch::zeros({unit.layout.padded}, unit.block.options());
      for (size_t k = 0; k < unit.parameters.size(); ++k) {
        auto& p = parameters_[unit.parameters[k]];
        auto place = unit.alias(unit.grad_flat, k);
        if (p.grad().defined()) place.copy_(p.grad());
        p.mutable_grad() = place;
      }
    }
  }
  if (!options_.prefetch) return;
  for (size_t u = index; u-- > 0;) {  // Note [fsdp prefetch]: the next unit backward will reach
    if (units_[u]->empty()) continue;
    gather(u);
    break;
  }
}

void FullyShardedDataParallel::gradient_ready(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_backward_ || !parameters_[k].grad().defined()) return;
  const size_t u = unit_of_[k];
  TANDEM_CHECK(u < reduced_down_to_, "FullyShardedDataParallel: a parameter of unit ", u,
               " received a gradient after the unit's reduce-scatter had started (a second backward "
               "pass after one forward?)");
  if (seen_[k]) return;  // a second use in this backward: it summed into .grad()
  seen_[k] = true;
  if (--missing_[u] == 0) launch_reductions();
}

void FullyShardedDataParallel::launch_reductions(bool pinned_too) {
  // A pinned unit waits for after_backward() (Note [fsdp tied weights]).
  while (reduced_down_to_ > 0 && missing_[reduced_down_to_ - 1] == 0 &&
         (pinned_too || !units_[reduced_down_to_ - 1]->pinned)) {
    reduce(--reduced_down_to_);
  }
}

void FullyShardedDataParallel::reduce(size_t index) {
  auto& unit = *units_[index];
  if (unit.empty()) return;
  torch::NoGradGuard no_grad;
  // The gradients, in the parameters' places; zeros for padding and for a
  // parameter without one. Normally backward added them there already
  // (Note [fsdp gradients in place]); a gradient that is not its alias
  // (none was set up: the unit's hook did not run) is copied in.
  auto flat = unit.grad_flat.defined()
                  ? unit.grad_flat
                  : torch::zeros({unit.layout.padded}, unit.block.options());
  unit.grad_flat = torch::Tensor();
  for (size_t k = 0; k < unit.parameters.size(); ++k) {
    auto& p = parameters_[unit.parameters[k]];
    const auto& g = p.grad();
    auto place = unit.slot(flat, k);
    if (g.defined() && (g.data_ptr() != place.data_ptr() || g.strides() != place.strides())) place.copy_(g);
    p.mutable_grad() = torch::Tensor();
  }
  release(index);  // its backward is over
  settle_reductions();  // Note [fsdp prefetch]: the previous unit's, which ran during this one's backward
  Unit::Pending pending;
  if (world_ == 1) {  // the full layout is the block's
    pending.output = flat;
  } else {
    // Note [fsdp shards]: each parameter's rows into the ranks' blocks.
    pending.input = torch::empty({unit.layout.padded}, flat.options());
    for (size_t k = 0; k < unit.parameters.size(); ++k) unit.chunks(pending.input, k).copy_(unit.rows(flat, k));
    flat = torch::Tensor();
    pending.output = torch::empty({unit.layout.shard}, pending.input.options());
    auto chunks = pending.input.chunk(world_);
    std::vector<torch::Tensor> inputs(chunks.begin(), chunks.end());
    pending.work = reduce_group_->reduce_scatter(pending.output, inputs, dist::ReduceOp::kAvg);
  }
  unit.pending.push_back(std::move(pending));
}

void FullyShardedDataParallel::after_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_backward_) return;
  bool any = std::any_of(seen_.begin(), seen_.end(), [](bool b) { return b; });
  if (any) {
    std::fill(missing_.begin(), missing_.end(), 0);
    launch_reductions(/*pinned_too=*/true);
  }
  settle_reductions();
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  in_backward_ = false;
  seen_.clear();
}

void FullyShardedDataParallel::reduce_accumulated_gradients() {
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(!in_backward_, "FullyShardedDataParallel: reduce_accumulated_gradients() in a step run through "
                              "forward() (after_backward() reduces that one)");
  // Last unit first, as backward would launch them (Note [fsdp collective order]).
  for (size_t u = units_.size(); u-- > 0;) reduce(u);
  settle_reductions();
}

void FullyShardedDataParallel::settle_reductions() {
  torch::NoGradGuard no_grad;
  for (auto& unit : units_) {
    for (auto& pending : unit->pending) {
      if (world_ > 1) pending.work.wait();
      for (size_t k = 0; k < unit->parameters.size(); ++k) {
        auto part = unit->shard_of(pending.output, k, rank_);
        auto& grad = shards_[unit->parameters[k]].mutable_grad();
        grad = grad.defined() ? grad + part : part;
      }
    }
    unit->pending.clear();  // the flat gradient goes
  }
}

}  // namespace tandem::parallel
