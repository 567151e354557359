// The whole model as one stage: a step's forward and backward in
// --grad-accum chunks (engine/stage_plan.h).
#include "tandem/engine/stage_plan.h"

#include <algorithm>

#include <ATen/record_function.h>

#include "tandem/dist/collectives.h"
#include "tandem/optim/amp.h"

namespace tandem::engine {
namespace {

class WholeModelPlan : public StagePlan {
 public:
  WholeModelPlan(models::Sequence model, torch::Device device, StepSettings step, WholeModelSettings settings)
      : model_(std::move(model)), device_(device), step_(std::move(step)), settings_(std::move(settings)) {}

  StepOutputs forward_backward(const torch::Tensor& inputs, const torch::Tensor& targets, DataPlan& data,
                               std::vector<double>& /*stage_idle*/) override {
    // --grad-accum: the batch in chunks, one forward and backward each. Each
    // chunk's mean loss is weighted by its share of the batch, so the
    // gradients add up to those of the batch's mean loss; the data plan
    // reduces only after the last chunk's backward.
    const int64_t rows = inputs.size(0);
    const int64_t chunks = std::min(settings_.grad_accum, rows);
    // Note [unequal batches]: --skip-bad-images can leave the ranks' batches
    // of different sizes, and the ranks average their gradients. Each rank's
    // mean loss is then weighted by its share of the global batch (rows x
    // world / all rows), so that the average is the gradient of the whole
    // batch's mean loss, as in one process. One all-reduce of a scalar a
    // step, only with --skip-bad-images over several ranks.
    torch::Tensor share;
    const int64_t world = settings_.data_ranks;
    if (settings_.unequal_batches && settings_.group && world > 1) {
      auto all_rows = torch::full({}, static_cast<double>(rows),
                                  torch::TensorOptions().dtype(torch::kFloat64).device(settings_.group->wire_device()));
      settings_.group->all_reduce(all_rows).wait();
      share = (static_cast<double>(rows * world) / all_rows).to(device_);
    }
    auto input_chunks = inputs.tensor_split(chunks), target_chunks = targets.tensor_split(chunks);
    std::vector<torch::Tensor> logits;
    StepOutputs out;
    for (int64_t k = 0; k < chunks; ++k) {
      Held accumulate_only = k + 1 < chunks ? data.accumulate_only() : nullptr;
      torch::Tensor loss;
      {
        RECORD_USER_SCOPE("tandem::forward");
        optim::AutocastGuard autocast(device_.type(), step_.amp);  // forward and loss only
        const auto& x = input_chunks[k];
        logits.push_back(data.forward(x));
        loss = step_.task->loss(logits.back(), target_chunks[k]);
        if (chunks > 1) loss = loss * (static_cast<double>(x.size(0)) / static_cast<double>(rows));
      }
      {
        RECORD_USER_SCOPE("tandem::backward");
        auto objective = share.defined() ? loss * share.to(loss.scalar_type()) : loss;
        (step_.scaler ? step_.scaler->scale(objective) : objective).backward();
      }
      out.loss = k == 0 ? loss : out.loss.detach() + loss.detach();
    }
    out.logits = chunks == 1 ? logits.front() : torch::cat(logits);
    return out;
  }

  EvalResult evaluate(const EvalSetup& setup, DataPlan& data) override {
    Forward forward = [this, &data](const torch::Tensor& x) {
      optim::AutocastGuard autocast(device_.type(), step_.amp);
      bool nhwc = step_.channels_last && x.dim() == 4;
      return data.evaluation_forward(nhwc ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x);
    };
    // Note [evaluation buffers]: each rank's BatchNorm statistics moved with
    // its own last batches since rank 0's were broadcast before the last
    // step. The ranks evaluate their shares of the test set with rank 0's, as
    // PyTorch's DDP does (it broadcasts buffers before every forward): the
    // reported score is then that of one model, the one --export-weights
    // writes (rank 0's); each rank's own scored up to 0.1% apart. The next
    // step broadcasts rank 0's before its forward anyway.
    if (setup.group && setup.data_ranks > 1 && !model_->buffers().empty()) {
      dist::broadcast_buffers(*model_, *setup.group);
    }
    return engine::evaluate(model_, *setup.dataset, setup.batch_size / setup.data_ranks, device_, setup.workers,
                            setup.group.get(), forward, step_.task.get(), setup.cut);
  }

 private:
  models::Sequence model_;
  torch::Device device_;
  StepSettings step_;
  WholeModelSettings settings_;
};

}  // namespace

std::unique_ptr<StagePlan> make_whole_model_plan(models::Sequence model, torch::Device device, StepSettings step,
                                                 WholeModelSettings settings) {
  return std::make_unique<WholeModelPlan>(std::move(model), device, std::move(step), std::move(settings));
}

}  // namespace tandem::engine
