#include "tandem/parallel/ddp.h"

#include <algorithm>
#include <unordered_set>

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include "tandem/dist/collectives.h"
#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

struct GradientReadyHook : torch::autograd::FunctionPostHook {
  GradientReadyHook(DistributedDataParallel* ddp, size_t index) : ddp_(ddp), index_(index) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    ddp_->gradient_ready(index_);
    return outputs;
  }
  DistributedDataParallel* ddp_;
  size_t index_;
};

std::string kind_of(const torch::Tensor& t) {
  return std::string(c10::toString(t.scalar_type())) + " " + t.device().str();
}

// A tensor over flat[offset, offset + p.numel()) shaped and strided like p
// (contiguous when p's strides are not dense). Made with set_ rather than
// slice/view, so autograd does not see a view: libtorch's
// Optimizer::zero_grad() calls detach_() on every gradient, which views
// refuse.
torch::Tensor alias_of(const torch::Tensor& flat, int64_t offset, const torch::Tensor& p) {
  std::vector<int64_t> strides(p.dim());
  if (p.is_non_overlapping_and_dense()) {
    strides = p.strides().vec();
  } else {
    int64_t stride = 1;
    for (int64_t d = p.dim() - 1; d >= 0; --d) {
      strides[d] = stride;
      stride *= std::max<int64_t>(p.size(d), 1);
    }
  }
  torch::NoGradGuard no_grad;
  auto alias = torch::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, p.sizes(), strides);
  return alias;
}

}  // namespace

double hidden_share(const DdpTimeline& t) {
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>>
      spans;
  for (size_t b = 0; b < t.launched.size() && b < t.finished.size(); ++b) {
    if (t.finished[b] > t.launched[b]) spans.emplace_back(t.launched[b], t.finished[b]);
  }
  std::sort(spans.begin(), spans.end());
  std::chrono::duration<double> total{0}, hidden{0};
  auto add = [&](auto begin, auto end) {
    total += end - begin;
    if (begin < t.backward_end) hidden += std::min(end, t.backward_end) - begin;
  };
  for (size_t i = 0; i < spans.size();) {  // merge overlapping spans into one
    auto begin = spans[i].first, end = spans[i].second;
    for (++i; i < spans.size() && spans[i].first <= end; ++i) end = std::max(end, spans[i].second);
    add(begin, end);
  }
  return total.count() > 0 ? hidden.count() / total.count() : 1.0;
}

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<dist::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(std::move(options)) {
  TANDEM_CHECK(module_ && group_, "DistributedDataParallel: a module and a group are required");
  hook_ = options_.comm_hook ? options_.comm_hook : make_comm_hook("allreduce");
  dist::check_same_parameters(*module_, *group_, "DistributedDataParallel");
  auto left_out = [this](const torch::Tensor& p) {
    for (const auto& t : options_.left_out) {
      if (t.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) return true;
    }
    return false;
  };
  if (options_.left_out.empty()) {
    dist::broadcast_module(*module_, *group_, 0);
  } else {  // the others' parameters and every buffer
    std::vector<torch::Tensor> started;
    for (const auto& p : module_->parameters()) {
      if (!left_out(p)) started.push_back(p);
    }
    for (const auto& b : module_->buffers()) started.push_back(b);
    dist::broadcast_coalesced(std::move(started), *group_, 0);
  }

  std::vector<ParameterInfo> info;
  for (auto& p : module_->named_parameters()) {
    if (!p.value().requires_grad() || left_out(p.value())) continue;
    parameters_.push_back(p.value());
    names_.push_back(p.key());
    info.push_back({p.value().numel() * static_cast<int64_t>(p.value().element_size()),
                    kind_of(p.value())});
  }
  buckets_ = plan_buckets(info, options_.buckets);
  deferred_.assign(parameters_.size(), false);
  for (size_t k = 0; k < parameters_.size(); ++k) {
    for (const auto& late : options_.reduced_after_backward) {
      if (late.unsafeGetTensorImpl() == parameters_[k].unsafeGetTensorImpl()) deferred_[k] = true;
    }
  }
  bucket_of_.resize(parameters_.size());
  views_.resize(parameters_.size());
  // Note [gradients are bucket views]
  for (size_t b = 0; b < buckets_.size(); ++b) {
    int64_t numel = 0;
    for (size_t k : buckets_[b].parameters) numel += parameters_[k].numel();
    flat_.push_back(torch::zeros({numel}, parameters_[buckets_[b].parameters[0]].options()));
    int64_t offset = 0;
    for (size_t k : buckets_[b].parameters) {
      const auto& p = parameters_[k];
      views_[k] = alias_of(flat_[b], offset, p);
      offset += p.numel();
      bucket_of_[k] = b;
      if (p.grad().defined()) adopt_view(k);
    }
  }
  // Note [communication stream]
  if (!parameters_.empty() && parameters_[0].is_cuda()) {
    auto device = parameters_[0].device();
    comm_stream_ = c10::impl::getDeviceGuardImpl(device.type())->getStreamFromGlobalPool(device);
    for (size_t b = 0; b < buckets_.size(); ++b) launch_events_.emplace_back(device.type());
    reduced_event_.emplace(device.type());
  }
  for (size_t k = 0; k < parameters_.size(); ++k) {
    auto accumulator = torch::autograd::impl::grad_accumulator(parameters_[k]);
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<GradientReadyHook>(this, k)));
    accumulators_.push_back(std::move(accumulator));
  }
  before_forward();
}

DistributedDataParallel::~DistributedDataParallel() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
}

bool DistributedDataParallel::grad_is_view(size_t k) const {
  const auto& g = parameters_[k].grad();
  return g.defined() && g.data_ptr() == views_[k].data_ptr() && g.strides() == views_[k].strides();
}

void DistributedDataParallel::adopt_view(size_t k) {
  torch::NoGradGuard no_grad;
  auto& p = parameters_[k];
  views_[k].copy_(p.grad());
  p.mutable_grad() = views_[k];
}

void DistributedDataParallel::zero_grad() {
  torch::NoGradGuard no_grad;
  for (auto& flat : flat_) flat.zero_();
  for (size_t k = 0; k < parameters_.size(); ++k) {
    if (parameters_[k].grad().defined() && !grad_is_view(k)) parameters_[k].mutable_grad() = views_[k];
  }
}

void DistributedDataParallel::before_forward() {
  {
    // Note [a step ends in after_backward]
    std::lock_guard<std::mutex> lock(mutex_);
    TANDEM_CHECK(!reducing_, "DistributedDataParallel: before_forward() while the last step's gradients were "
                             "still being reduced: call after_backward() after each backward (outside no_sync()), "
                             "before the optimizer's step");
  }
  if (options_.broadcast_buffers) dist::broadcast_buffers(*module_, *group_, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  missing_.assign(buckets_.size(), 0);
  // Note [gradients in parts]: a bucket with a deferred parameter counts
  // one more, which only after_backward() takes away.
  for (size_t b = 0; b < buckets_.size(); ++b) {
    bool deferred = false;
    for (size_t k : buckets_[b].parameters) {
      if (deferred_[k]) {
        deferred = true;
      } else {
        ++missing_[b];
      }
    }
    missing_[b] += deferred ? 1 : 0;
  }
  seen_.assign(parameters_.size(), false);
  in_step_ = true;
  unused_.assign(parameters_.size(), false);
  next_launch_ = 0;
  work_.assign(buckets_.size(), dist::Work());
  timeline_ = DdpTimeline{};
  timeline_.launched.resize(buckets_.size());
  timeline_.finished.resize(buckets_.size());
}

void DistributedDataParallel::prepare_for_backward(const torch::Tensor& loss) {
  if (!options_.find_unused_parameters || !sync_) return;
  std::unordered_set<torch::autograd::Node*> reached;
  std::vector<torch::autograd::Node*> stack;
  if (loss.grad_fn()) stack.push_back(loss.grad_fn().get());
  while (!stack.empty()) {
    auto* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      if (edge.function && reached.insert(edge.function.get()).second) stack.push_back(edge.function.get());
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  TANDEM_CHECK(in_step_, "DistributedDataParallel: prepare_for_backward() without before_forward()");
  for (size_t k = 0; k < parameters_.size(); ++k) {
    if (reached.count(accumulators_[k].get()) || seen_[k] || unused_[k] || deferred_[k]) continue;
    unused_[k] = true;
    --missing_[bucket_of_[k]];
  }
  launch_in_order();
}

void DistributedDataParallel::gradient_ready(size_t k) {
  std::lock_guard<std::mutex> lock(mutex_);
  // The hook also runs when the incoming gradient was undefined (a path that
  // carries none); with no gradient yet, the parameter counts as unused.
  if (!parameters_[k].grad().defined()) return;
  if (!grad_is_view(k)) adopt_view(k);
  if (!sync_ || seen_.empty() || deferred_[k]) return;  // deferred: reduced in after_backward()
  if (seen_[k] || unused_[k]) {
    // A second gradient in one step (or one for a parameter the graph walk
    // found unreachable): harmless while its bucket waits, since it summed
    // into the bucket; an error once the bucket is on the wire.
    TANDEM_CHECK(bucket_of_[k] >= next_launch_, "DistributedDataParallel: parameter '", names_[k],
                 "' received a gradient after its bucket's all-reduce had started (a second "
                 "backward pass in one step? use no_sync() for all but the last)");
    return;
  }
  seen_[k] = true;
  if (--missing_[bucket_of_[k]] == 0) launch_in_order();
}

void DistributedDataParallel::launch_in_order() {
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) {
    size_t b = next_launch_++;
    // Note [unused parameters]: no gradient this step; an undefined one
    // counts as zero.
    for (size_t k : buckets_[b].parameters) {
      if (seen_[k]) continue;
      if (!parameters_[k].grad().defined()) {
        views_[k].zero_();
      } else if (!grad_is_view(k)) {
        adopt_view(k);
      }
    }
    timeline_.launched[b] = std::chrono::steady_clock::now();
    reducing_ = true;
    if (!comm_stream_) {
      work_[b] = hook_->reduce(*group_, flat_[b]);
      continue;
    }
    // Note [communication stream]: after what this thread's stream queued
    // (the bucket's last gradients, the zeroing above).
    launch_events_[b].record(current_stream());
    launch_events_[b].block(*comm_stream_);
    c10::StreamGuard guard(*comm_stream_);
    work_[b] = hook_->reduce(*group_, flat_[b]);
  }
}

c10::Stream DistributedDataParallel::current_stream() const {
  return c10::impl::getDeviceGuardImpl(comm_stream_->device_type())->getStream(comm_stream_->device());
}

void DistributedDataParallel::after_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;  // accumulating (no_sync): the next synchronised step reduces the sums
  TANDEM_CHECK(in_step_, "DistributedDataParallel: after_backward() without before_forward()");
  timeline_.backward_end = std::chrono::steady_clock::now();
  // Parameters without a gradient: their buckets are complete now.
  std::vector<bool> had_grad(parameters_.size());
  for (size_t k = 0; k < parameters_.size(); ++k) had_grad[k] = parameters_[k].grad().defined();
  for (auto& m : missing_) m = 0;
  launch_in_order();
  // Note [unused parameters]: which parameters got a gradient on any rank.
  // Used: has a gradient now, from this step or from no_sync steps before.
  // With several ranks every rank reduces the flags every step; only a rank
  // with a parameter that had none locally waits for the answer (no host
  // sync otherwise: the reduction is waited for at the next step's). One
  // rank's own flags are the answer.
  bool all_had_grad = true;
  for (size_t k = 0; k < parameters_.size(); ++k) all_had_grad = all_had_grad && had_grad[k];
  const bool reduce_flags = group_->size() > 1 && !parameters_.empty();
  if (used_.defined()) used_work_.wait();
  if (reduce_flags) {
    // Pinned, and copied without blocking: a copy from pageable memory
    // would wait for the whole backward on the host every step.
    const bool cuda = parameters_[0].is_cuda();
    auto used = torch::empty({static_cast<int64_t>(parameters_.size())},
                             torch::TensorOptions().dtype(torch::kInt32).pinned_memory(cuda));
    auto* flag = used.data_ptr<int32_t>();
    for (size_t k = 0; k < parameters_.size(); ++k) flag[k] = had_grad[k] ? 1 : 0;
    used_ = used.to(parameters_[0].device(), /*non_blocking=*/true);  // NCCL: CUDA only
    used_work_ = group_->all_reduce(used_, dist::ReduceOp::kMax);
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (comm_stream_) {  // the stream waits, and the hook's last steps run there
      c10::StreamGuard guard(*comm_stream_);
      work_[b].wait();
    } else {
      work_[b].wait();
    }
    timeline_.finished[b] = work_[b].finished_at().value_or(std::chrono::steady_clock::now());
  }
  if (comm_stream_) {  // Note [communication stream]: the averages before the optimizer
    reduced_event_->record(*comm_stream_);
    reduced_event_->block(current_stream());
  }
  if (!all_had_grad && reduce_flags) {
    used_work_.wait();
    auto used = used_.cpu();
    used_ = torch::Tensor();
    for (size_t k = 0; k < parameters_.size(); ++k) {
      if (had_grad[k]) continue;  // its gradient is the view, averaged in place
      if (used.data_ptr<int32_t>()[k] != 0) parameters_[k].mutable_grad() = views_[k];
    }
  }
  seen_.clear();  // the next step starts with before_forward()
  in_step_ = false;
  reducing_ = false;
}

}  // namespace tandem::parallel
