// --strategy ddp (the default over ranks): parallel::DistributedDataParallel
// as a data plan (engine/data_plan.h).
#include <algorithm>

#include "data_plans.h"
#include "tandem/parallel/comm_hook.h"
#include "tandem/parallel/ddp.h"

namespace tandem::engine::internal {
namespace {

// Note [reducing during the last backward]: under a pipeline, a rank's
// chunks (its pieces of the model) each get a DDP of their own over the dp
// group. Their micro-batches' gradients accumulate without communication
// until the pipeline announces a chunk's last backward; that chunk's DDP
// then syncs again, so its buckets are all-reduced as that backward makes
// them, while the other chunks and stages still compute, as DDP without a
// pipeline overlaps its one backward. The dp replicas of a stage run the
// same actions, so they launch the same buckets in the same order. One
// DDP over all the chunks could not: a chunk's last backward may come
// before another's earlier ones (interleaved), whose gradients would then
// arrive after their buckets were on the wire.
class DdpPlan : public DataPlan {
 public:
  DdpPlan(models::Sequence model, const std::vector<std::shared_ptr<torch::nn::Module>>& replicas,
          const std::shared_ptr<dist::ProcessGroup>& group, parallel::DdpOptions options,
          const std::string& comm_hook, bool on_cuda)
      : DataPlan(std::move(model)), on_cuda_(on_cuda) {
    for (const auto& replica : replicas) {
      options.comm_hook = parallel::make_comm_hook(comm_hook);  // each its own
      ddps_.push_back(std::make_shared<parallel::DistributedDataParallel>(replica, group, options));
    }
  }
  std::string name() const override { return "ddp"; }

  void begin_step(torch::optim::Optimizer& optimizer) override {
    // Note [gradients are bucket views]: on CPU, letting backward's fresh
    // gradient be copied into the bucket once measured faster than zeroing
    // the bucket and accumulating into it (bench/ddp.sh, bench/results/ddp.md);
    // on CUDA the in-place form saves the memory.
    if (!on_cuda_) optimizer.zero_grad();
    for (auto& ddp : ddps_) {
      if (on_cuda_) ddp->zero_grad();
      ddp->before_forward();  // BatchNorm statistics from rank 0
    }
  }
  // DDP's hooks sit on the parameters: the model's own forward.
  torch::Tensor forward(const torch::Tensor& x) override { return model_->forward(x); }
  Held accumulate_only() override {
    paused_.clear();
    for (auto& ddp : ddps_) paused_.push_back(std::make_shared<parallel::DistributedDataParallel::NoSync>(*ddp));
    return std::make_shared<Resume>(paused_);
  }
  void before_last_backward(int64_t chunk) override {
    if (chunk >= 0 && static_cast<size_t>(chunk) < paused_.size()) paused_[chunk].reset();
  }
  void after_backward() override {  // buckets were all-reduced during backward
    for (auto& ddp : ddps_) ddp->after_backward();
  }
  std::vector<torch::Tensor> parameters() const override { return model_->parameters(); }

 private:
  using Paused = std::vector<std::shared_ptr<parallel::DistributedDataParallel::NoSync>>;
  // Held by the caller: letting go syncs every chunk still paused.
  struct Resume {
    explicit Resume(Paused& paused) : paused(paused) {}
    ~Resume() { paused.clear(); }
    Paused& paused;
  };
  std::vector<std::shared_ptr<parallel::DistributedDataParallel>> ddps_;  // one per chunk
  Paused paused_;
  bool on_cuda_;
};

}  // namespace

std::unique_ptr<DataPlan> make_ddp_plan(const DataPlanSetup& setup) {
  const auto& o = *setup.options;
  parallel::DdpOptions ddp;  // --bucket-cap-mb, --ddp-comm-hook
  ddp.buckets.bucket_bytes = static_cast<int64_t>(o.bucket_cap_mb * (1 << 20));
  ddp.buckets.first_bucket_bytes = std::min(ddp.buckets.first_bucket_bytes, ddp.buckets.bucket_bytes);
  ddp.buckets.last_bucket_bytes = std::min(ddp.buckets.last_bucket_bytes, ddp.buckets.bucket_bytes);
  // Note [gradients in parts]: a tied weight's gradient may come in two.
  const auto named = setup.model->named_parameters();
  for (const auto& tie : setup.model->ties()) {
    if (const auto* p = named.find(tie.owner)) ddp.reduced_after_backward.push_back(*p);
  }
  ddp.left_out = setup.left_out;  // Note [expert gradients]
  std::vector<std::shared_ptr<torch::nn::Module>> replicas;
  for (const auto& piece : setup.pieces) replicas.push_back(piece.ptr());
  if (replicas.empty()) replicas.push_back(setup.model.ptr());
  return std::make_unique<DdpPlan>(setup.model, replicas, setup.group, ddp, option_name(o.ddp_comm_hook),
                                   setup.device.is_cuda());
}

}  // namespace tandem::engine::internal
