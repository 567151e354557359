// The pipelines as stage plans (engine/stage_plan.h): over --devices in
// this process, and over the pp ranks.
#include <ATen/record_function.h>

#include "tandem/engine/stage_plan.h"
#include "tandem/optim/amp.h"
#include "tandem/util/check.h"

namespace tandem::engine {
namespace {

// Autocast per micro-batch forward in the stages (PipelineOptions); the
// fp16 scaler scales each micro-batch's loss before its backward.
parallel::LossScale loss_scale(const StepSettings& task) {
  if (!task.scaler) return {};
  auto* scaler = task.scaler;
  return [scaler](const torch::Tensor& loss) { return scaler->scale(loss); };
}

// A micro-batch's mean loss, the task's.
parallel::PipelineLoss micro_loss(const StepSettings& task) {
  auto of = task.task;
  return [of](const torch::Tensor& output, const torch::Tensor& target) { return of->loss(output, target); };
}

class LocalPipelinePlan : public StagePlan {
 public:
  LocalPipelinePlan(models::Sequence model, const std::vector<int64_t>& sizes, const std::vector<torch::Device>& devices,
                    const parallel::PipelineOptions& options, StepSettings step)
      : model_(model),
        devices_(devices),
        step_(std::move(step)),
        pipeline_(std::make_unique<parallel::Pipeline>(model, sizes, devices, options)) {}

  StepOutputs forward_backward(const torch::Tensor& inputs, const torch::Tensor& targets, DataPlan& data,
                               std::vector<double>& stage_idle) override {
    RECORD_USER_SCOPE("tandem::pipeline");
    Held micro_batches = data.begin_micro_batches();
    auto micro = pipeline_->train_step(inputs, targets, micro_loss(step_), loss_scale(step_));
    data.end_micro_batches();
    micro_batches.reset();
    auto idle = micro.idle_share();
    for (size_t s = 0; s < idle.size() && s < stage_idle.size(); ++s) stage_idle[s] += idle[s];
    return {micro.output, micro.loss};
  }
  int64_t stages() const override { return static_cast<int64_t>(devices_.size()); }

  EvalResult evaluate(const EvalSetup& setup, DataPlan& /*data*/) override {
    Forward forward = [this](const torch::Tensor& x) {
      // Autocast on every kind of device the stages are on (the whole
      // batch goes through the stages in this thread).
      optim::AutocastGuard cpu(torch::kCPU, step_.amp);
      optim::AutocastGuard cuda(torch::kCUDA, step_.amp);
      return pipeline_->forward(x);
    };
    // Outputs, targets and the loss live on the last stage.
    return engine::evaluate(model_, *setup.dataset, setup.batch_size, devices_.back(), setup.workers, nullptr,
                            forward, step_.task.get());
  }

 private:
  models::Sequence model_;
  std::vector<torch::Device> devices_;
  StepSettings step_;
  std::unique_ptr<parallel::Pipeline> pipeline_;
};

class RankPipelinePlan : public StagePlan {
 public:
  RankPipelinePlan(models::Sequence model, const std::vector<models::Sequence>& pieces, torch::Device device,
                   std::shared_ptr<dist::ProcessGroup> stages, parallel::PipelineOptions options, StepSettings step)
      : model_(std::move(model)), device_(device), stages_(std::move(stages)), step_(std::move(step)) {
    // Note [reducing during the last backward]: the step's data plan may
    // start reducing a chunk's gradients before the step's last backward.
    options.before_last_backward = [this](int64_t chunk) {
      if (announce_to_) announce_to_->before_last_backward(chunk);
    };
    pipeline_ = std::make_unique<parallel::DistributedPipeline>(pieces, device_, stages_, options);
  }

  StepOutputs forward_backward(const torch::Tensor& inputs, const torch::Tensor& targets, DataPlan& data,
                               std::vector<double>& stage_idle) override {
    RECORD_USER_SCOPE("tandem::pipeline");
    // Note [replicated stages]: the micro-batches' gradients accumulate;
    // DDP reduces each chunk's during its last backward, FSDP just after
    // the step with the stage gathered over it (Note [fsdp under a
    // pipeline]), the all-reduce in after_backward().
    Held micro_batches = data.begin_micro_batches();
    struct Announcing {
      Announcing(DataPlan*& to, DataPlan& data) : to(to) { to = &data; }
      ~Announcing() { to = nullptr; }
      DataPlan*& to;
    } announcing(announce_to_, data);
    auto micro = pipeline_->train_step(inputs, targets, micro_loss(step_), loss_scale(step_));
    data.end_micro_batches();
    micro_batches.reset();
    stage_idle.at(stages_->rank()) += micro.idle_share().at(0);
    return {micro.output, micro.loss};  // the output on the last stage only; the loss on every stage
  }
  int64_t stages() const override { return stages_->size(); }
  int64_t stage_index() const override { return stages_->rank(); }

  EvalResult evaluate(const EvalSetup& setup, DataPlan& data) override {
    // Every stage passes every batch on; the last stage's result is the
    // job's (the others' forward returns no output, and they count nothing).
    // Under a mesh each replica pipeline takes its dp rank's share of the
    // test set, and the last stages' sums add up over their dp slice. FSDP x
    // pipeline: the stage's units gathered once for the whole evaluation,
    // as for a training step.
    Forward forward = [this](const torch::Tensor& x) { return pipeline_->forward(x); };
    Held gathered = data.whole_model(/*write_back=*/false);
    auto result = engine::evaluate(model_, *setup.dataset, setup.batch_size, device_, setup.workers,
                                   setup.group.get(), forward, step_.task.get(), setup.cut);
    gathered.reset();
    const auto wire = stages_->wire_device();
    auto values = torch::tensor({result.loss, result.accuracy, static_cast<double>(result.count)},
                                torch::kFloat64).to(wire);
    stages_->broadcast(values, stages_->size() - 1).wait();
    values = values.cpu();
    return {values[0].item<double>(), values[1].item<double>(), static_cast<int64_t>(values[2].item<double>())};
  }

 private:
  models::Sequence model_;
  torch::Device device_;
  std::shared_ptr<dist::ProcessGroup> stages_;
  StepSettings step_;
  DataPlan* announce_to_ = nullptr;  // the data plan of the step under way
  std::unique_ptr<parallel::DistributedPipeline> pipeline_;
};

}  // namespace

std::unique_ptr<StagePlan> make_local_pipeline_plan(models::Sequence model, const std::vector<int64_t>& sizes,
                                                    const std::vector<torch::Device>& devices,
                                                    parallel::PipelineOptions options, StepSettings step) {
  return std::make_unique<LocalPipelinePlan>(std::move(model), sizes, devices, options, std::move(step));
}

std::unique_ptr<StagePlan> make_rank_pipeline_plan(models::Sequence model, const std::vector<models::Sequence>& pieces,
                                                   torch::Device device, std::shared_ptr<dist::ProcessGroup> stages,
                                                   parallel::PipelineOptions options, StepSettings step) {
  return std::make_unique<RankPipelinePlan>(std::move(model), pieces, device, std::move(stages), std::move(options),
                                            std::move(step));
}

}  // namespace tandem::engine
