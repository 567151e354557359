// The data plans without a wrapper of their own: one process, seed 004's
// all-reduce after backward, and DataParallel in one process; and the
// choice among all of them (engine/data_plan.h).
#include "tandem/engine/data_plan.h"

#include "data_plans.h"
#include "tandem/dist/collectives.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::engine {

torch::Tensor DataPlan::evaluation_forward(const torch::Tensor& x) { return model_->forward(x); }

std::vector<dist::PlacedTensor> DataPlan::placed_parameters() const {
  std::vector<dist::PlacedTensor> placed;
  for (const auto& p : model_->named_parameters()) placed.push_back({p.key(), p.value(), p.value()});
  return placed;
}

namespace {

// One process, or a pipeline's ranks without data parallelism: the model as it is.
class LocalPlan : public DataPlan {
 public:
  explicit LocalPlan(models::Sequence model) : DataPlan(std::move(model)) {}
  std::string name() const override { return "one process"; }
  // To none: under --cuda-graph the captured backward assigns them.
  void begin_step(torch::optim::Optimizer& optimizer) override { optimizer.zero_grad(); }
  torch::Tensor forward(const torch::Tensor& x) override { return model_->forward(x); }
  void after_backward() override {}
  std::vector<torch::Tensor> parameters() const override { return model_->parameters(); }
};

// --strategy allreduce (seed 004): every rank starts from dp rank 0's
// weights, and the gradients are averaged after backward, one all-reduce
// per parameter.
class AllReducePlan : public DataPlan {
 public:
  // `left_out`: parameters each rank keeps its own (DataPlanSetup::left_out).
  AllReducePlan(models::Sequence model, std::shared_ptr<torch::nn::Module> replica,
                std::shared_ptr<dist::ProcessGroup> group, const std::vector<torch::Tensor>& left_out)
      : DataPlan(std::move(model)), replica_(std::move(replica)), group_(std::move(group)) {
    for (const auto& p : replica_->parameters()) {
      bool kept = true;
      for (const auto& t : left_out) kept = kept && t.unsafeGetTensorImpl() != p.unsafeGetTensorImpl();
      if (kept) reduced_.push_back(p);
    }
    auto started = reduced_;
    for (const auto& b : replica_->buffers()) started.push_back(b);
    dist::broadcast_coalesced(std::move(started), *group_);
  }
  std::string name() const override { return "allreduce"; }
  void begin_step(torch::optim::Optimizer& optimizer) override {
    optimizer.zero_grad();
    dist::broadcast_buffers(*replica_, *group_);
  }
  torch::Tensor forward(const torch::Tensor& x) override { return model_->forward(x); }
  void after_backward() override { dist::average_gradients(reduced_, *group_); }
  std::vector<torch::Tensor> parameters() const override { return model_->parameters(); }

 private:
  std::shared_ptr<torch::nn::Module> replica_;
  std::shared_ptr<dist::ProcessGroup> group_;
  std::vector<torch::Tensor> reduced_;  // the replica's parameters but those left out
};

// --strategy dp: the batch scattered over --devices in this process, the
// outputs gathered on --device; one set of gradients, on the first device.
class InProcessPlan : public DataPlan {
 public:
  InProcessPlan(models::Sequence model, parallel::DataParallel dp, int64_t batch, torch::Device output)
      : DataPlan(std::move(model)), dp_(std::move(dp)), batch_(batch), output_(output) {}
  std::string name() const override { return "dp"; }
  std::vector<std::string> describe() const override {
    std::string names;
    for (const auto& d : dp_->devices()) names += (names.empty() ? "" : ",") + d.str();
    return {format("DataParallel over %s in one process: the batch of %lld scattered, outputs gathered on %s",
                   names.c_str(), static_cast<long long>(batch_), output_.str().c_str())};
  }
  void begin_step(torch::optim::Optimizer& optimizer) override { optimizer.zero_grad(); }
  torch::Tensor forward(const torch::Tensor& x) override { return dp_->forward(x); }
  void after_backward() override {}
  std::vector<torch::Tensor> parameters() const override { return model_->parameters(); }

 private:
  parallel::DataParallel dp_;
  int64_t batch_;
  torch::Device output_;
};

}  // namespace

namespace internal {

std::shared_ptr<torch::nn::Module> replica_of(const DataPlanSetup& setup) {
  if (setup.pieces.empty()) return setup.model.ptr();
  auto pieces = std::make_shared<torch::nn::Module>("PipelinePieces");
  for (size_t k = 0; k < setup.pieces.size(); ++k) {
    pieces->register_module("piece" + std::to_string(k), setup.pieces[k]);
  }
  return pieces;
}

}  // namespace internal

std::unique_ptr<DataPlan> make_data_plan(const DataPlanSetup& setup) {
  const auto& o = *setup.options;
  if (o.strategy == Strategy::kDp) {
    TANDEM_CHECK(!setup.group, "--strategy dp runs in one process");
    parallel::DataParallelOptions options;
    options.devices = parallel::parse_devices(o.devices);
    options.output_device = setup.device;
    options.trace = o.dp_trace;
    return std::make_unique<InProcessPlan>(setup.model, parallel::DataParallel(setup.model, options), o.batch_size,
                                           setup.device);
  }
  if (!setup.group) return std::make_unique<LocalPlan>(setup.model);
  // Under a mesh the layout says; otherwise --strategy does (a group of one
  // rank is averaged over, so that it trains as one process). The group's
  // size, not the data ranks': under cp the ranks of one sample reduce
  // their gradients together too.
  const bool mesh = !setup.pieces.empty();
  const auto data = mesh ? setup.layout.data
                         : o.strategy == Strategy::kFsdp                             ? DataParallelism::kFsdp
                           : setup.group->size() > 1 && o.strategy != Strategy::kAllReduce ? DataParallelism::kDdp
                                                                                        : DataParallelism::kAllReduce;
  switch (data) {
    case DataParallelism::kDdp:
      return internal::make_ddp_plan(setup);
    case DataParallelism::kFsdp:
      return internal::make_fsdp_plan(setup);
    default:
      return std::make_unique<AllReducePlan>(setup.model, internal::replica_of(setup), setup.group, setup.left_out);
  }
}

}  // namespace tandem::engine
