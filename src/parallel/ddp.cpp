#include "tandem/parallel/ddp.h"

#include <functional>
#include <sstream>

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

// Every rank must hold the same parameters: compare a hash of the names and
// shapes, all-gathered.
void check_same_parameters(torch::nn::Module& module, dist::ProcessGroup& group) {
  std::ostringstream text;
  for (const auto& p : module.named_parameters()) text << p.key() << p.value().sizes() << ";";
  auto mine = torch::tensor({static_cast<int64_t>(std::hash<std::string>{}(text.str()) >> 1)},
                            torch::kInt64);
  std::vector<torch::Tensor> all(group.size());
  for (auto& t : all) t = torch::empty({1}, torch::kInt64);
  group.all_gather(all, mine).wait();
  for (int64_t r = 0; r < group.size(); ++r) {
    TANDEM_CHECK(torch::equal(all[r], all[0]), "DistributedDataParallel: rank ", r,
                 " has different parameters (names or shapes) from rank 0; every rank must "
                 "build the same model");
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(std::shared_ptr<torch::nn::Module> module,
                                                 std::shared_ptr<dist::ProcessGroup> group,
                                                 DdpOptions options)
    : module_(std::move(module)), group_(std::move(group)), options_(options) {
  TANDEM_CHECK(module_ && group_, "DistributedDataParallel: a module and a group are required");
  check_same_parameters(*module_, *group_);
  dist::broadcast_module(*module_, *group_, 0);

  std::vector<ParameterInfo> info;
  for (auto& p : module_->parameters()) {
    if (!p.requires_grad()) continue;
    parameters_.push_back(p);
    info.push_back({p.numel() * static_cast<int64_t>(p.element_size()), kind_of(p)});
  }
  buckets_ = plan_buckets(info, options_.buckets);
  bucket_of_.resize(parameters_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t k : buckets_[b].parameters) bucket_of_[k] = b;
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

void DistributedDataParallel::before_forward() {
  if (options_.broadcast_buffers) dist::broadcast_buffers(*module_, *group_, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  missing_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = static_cast<int64_t>(buckets_[b].parameters.size());
  seen_.assign(parameters_.size(), false);
  next_launch_ = 0;
  flat_.assign(buckets_.size(), torch::Tensor());
  work_.assign(buckets_.size(), dist::Work());
  timeline_ = DdpTimeline{};
  timeline_.launched.resize(buckets_.size());
  timeline_.finished.resize(buckets_.size());
}

void DistributedDataParallel::gradient_ready(size_t parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_ || seen_.empty() || seen_[parameter]) return;  // used twice: fires twice
  seen_[parameter] = true;
  if (--missing_[bucket_of_[parameter]] == 0) launch_in_order();
}

void DistributedDataParallel::launch_in_order() {
  while (next_launch_ < buckets_.size() && missing_[next_launch_] == 0) launch(next_launch_++);
}

void DistributedDataParallel::launch(size_t b) {
  std::vector<torch::Tensor> pieces;
  for (size_t k : buckets_[b].parameters) {
    const auto& p = parameters_[k];
    auto grad = p.grad();
    pieces.push_back(grad.defined() ? grad.reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  }
  flat_[b] = torch::cat(pieces);
  timeline_.launched[b] = std::chrono::steady_clock::now();
  work_[b] = group_->all_reduce(flat_[b], dist::ReduceOp::kAvg);
}

void DistributedDataParallel::after_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!sync_) return;  // accumulating (no_sync): the next synchronised step reduces the sums
  TANDEM_CHECK(!seen_.empty(), "DistributedDataParallel: after_backward() without before_forward()");
  timeline_.backward_end = std::chrono::steady_clock::now();
  // Unused parameters: their buckets are complete now, with zeros.
  for (auto& m : missing_) m = 0;
  launch_in_order();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    work_[b].wait();
    timeline_.finished[b] = std::chrono::steady_clock::now();
    int64_t offset = 0;
    torch::NoGradGuard no_grad;
    for (size_t k : buckets_[b].parameters) {
      auto& p = parameters_[k];
      auto averaged = flat_[b].slice(0, offset, offset + p.numel()).view_as(p);
      offset += p.numel();
      if (p.grad().defined()) {
        p.mutable_grad().copy_(averaged);
      } else {
        p.mutable_grad() = averaged.clone();
      }
    }
  }
  seen_.clear();  // the next step starts with before_forward()
}

}  // namespace tandem::parallel
