#include "tandem/parallel/comm_hook.h"

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

class AllReduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  dist::Work reduce(dist::ProcessGroup& group, torch::Tensor bucket) override {
    return group.all_reduce(bucket, dist::ReduceOp::kAvg);
  }
};

class CompressHook : public CommHook {
 public:
  CompressHook(std::string name, torch::ScalarType dtype) : name_(std::move(name)), dtype_(dtype) {}
  std::string name() const override { return name_; }
  dist::Work reduce(dist::ProcessGroup& group, torch::Tensor bucket) override {
    if (!bucket.is_floating_point()) return group.all_reduce(bucket, dist::ReduceOp::kAvg);
    // Divide before summing so that the sum of the world's contributions
    // stays in range (float16 ends at 65504).
    torch::NoGradGuard no_grad;
    bucket.div_(group.size());
    if (bucket.scalar_type() == dtype_) return group.all_reduce(bucket, dist::ReduceOp::kSum);
    auto compressed = bucket.to(dtype_);
    auto work = group.all_reduce(compressed, dist::ReduceOp::kSum);
    work.then([bucket, compressed]() mutable { bucket.copy_(compressed); });
    return work;
  }

 private:
  std::string name_;
  torch::ScalarType dtype_;
};

}  // namespace

std::shared_ptr<CommHook> make_comm_hook(const std::string& name) {
  if (name == "allreduce") return std::make_shared<AllReduceHook>();
  if (name == "fp16") return std::make_shared<CompressHook>("fp16", torch::kHalf);
  if (name == "bf16") return std::make_shared<CompressHook>("bf16", torch::kBFloat16);
  TANDEM_FAIL("--ddp-comm-hook: expected allreduce, fp16 or bf16, got '", name, "'");
}

}  // namespace tandem::parallel
