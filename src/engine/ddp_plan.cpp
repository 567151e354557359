// --strategy ddp (the default over ranks): parallel::DistributedDataParallel
// as a data plan (engine/data_plan.h).
#include <algorithm>

#include "data_plans.h"
#include "tandem/parallel/comm_hook.h"
#include "tandem/parallel/ddp.h"

namespace tandem::engine::internal {
namespace {

class DdpPlan : public DataPlan {
 public:
  DdpPlan(models::Sequence model, std::shared_ptr<torch::nn::Module> replica,
          std::shared_ptr<dist::ProcessGroup> group, parallel::DdpOptions options, bool on_cuda)
      : DataPlan(std::move(model)),
        ddp_(std::make_shared<parallel::DistributedDataParallel>(std::move(replica), std::move(group),
                                                                 std::move(options))),
        on_cuda_(on_cuda) {}
  std::string name() const override { return "ddp"; }

  void begin_step(torch::optim::Optimizer& optimizer) override {
    // Note [gradients are bucket views]: on CPU, letting backward's fresh
    // gradient be copied into the bucket once measured faster than zeroing
    // the bucket and accumulating into it (bench/ddp.sh, bench/results/ddp.md);
    // on CUDA the in-place form saves the memory.
    if (on_cuda_) {
      ddp_->zero_grad();
    } else {
      optimizer.zero_grad();
    }
    ddp_->before_forward();  // BatchNorm statistics from rank 0
  }
  // DDP's hooks sit on the parameters: the model's own forward.
  torch::Tensor forward(const torch::Tensor& x) override { return model_->forward(x); }
  Held accumulate_only() override { return std::make_shared<parallel::DistributedDataParallel::NoSync>(*ddp_); }
  void after_backward() override { ddp_->after_backward(); }  // buckets were all-reduced during backward
  std::vector<torch::Tensor> parameters() const override { return model_->parameters(); }

 private:
  std::shared_ptr<parallel::DistributedDataParallel> ddp_;
  bool on_cuda_;
};

}  // namespace

std::unique_ptr<DataPlan> make_ddp_plan(const DataPlanSetup& setup) {
  const auto& o = *setup.options;
  parallel::DdpOptions ddp;  // --bucket-cap-mb, --ddp-comm-hook
  ddp.buckets.bucket_bytes = static_cast<int64_t>(o.bucket_cap_mb * (1 << 20));
  ddp.buckets.first_bucket_bytes = std::min(ddp.buckets.first_bucket_bytes, ddp.buckets.bucket_bytes);
  ddp.buckets.last_bucket_bytes = std::min(ddp.buckets.last_bucket_bytes, ddp.buckets.bucket_bytes);
  ddp.comm_hook = parallel::make_comm_hook(o.ddp_comm_hook);
  return std::make_unique<DdpPlan>(setup.model, replica_of(setup), setup.group, std::move(ddp),
                                   setup.device.is_cuda());
}

}  // namespace tandem::engine::internal
