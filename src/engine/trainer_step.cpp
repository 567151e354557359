// One training step as the layout says, and evaluation (trainer.h).
#include "tandem/engine/trainer.h"

#include <algorithm>
#include <optional>

#include <ATen/record_function.h>

#include "tandem/data/device_prefetcher.h"
#include "tandem/data/loader.h"
#include "tandem/dist/collectives.h"
#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/clip.h"
#include "tandem/util/arith.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "trainer_internal.h"

namespace tandem::engine {

StepOutputs Trainer::step(const torch::Tensor& inputs, const torch::Tensor& targets,
                          torch::optim::Optimizer& optimizer, StepCounters& counters) {
  RECORD_USER_SCOPE("tandem::step");  // the phases, for --profile-out (engine/profile.h)
  plan_->begin_step(optimizer);  // gradients cleared, BatchNorm statistics from dp rank 0
  StepOutputs out;
  if (pipeline_ || rank_pipeline_) {  // forward and backward, micro-batch by micro-batch
    RECORD_USER_SCOPE("tandem::pipeline");
    // Autocast per micro-batch forward in the stages (PipelineOptions); the
    // fp16 scaler scales each micro-batch's loss before its backward.
    parallel::LossScale scale;
    if (scaler_) scale = [this](const torch::Tensor& loss) { return scaler_->scale(loss); };
    const parallel::PipelineLoss micro_loss = [this](const torch::Tensor& output, const torch::Tensor& target) {
      return torch::nn::functional::cross_entropy(output, target, loss_options_);
    };
    if (pipeline_) {
      auto micro = pipeline_->train_step(inputs, targets, micro_loss, scale);
      out.logits = micro.output;
      out.loss = micro.loss;
      auto idle = micro.idle_share();
      for (size_t s = 0; s < idle.size(); ++s) counters.stage_idle[s] += idle[s];
    } else {  // this rank's stage (Note [pipeline over ranks])
      // Note [replicated stages]: the micro-batches' gradients accumulate;
      // DDP reduces their sum in after_backward(), FSDP just after the step
      // with the stage gathered over it (Note [fsdp under a pipeline]).
      Held micro_batches = plan_->begin_micro_batches();
      auto micro = rank_pipeline_->train_step(inputs, targets, micro_loss, scale);
      plan_->end_micro_batches();
      micro_batches.reset();
      out.logits = micro.output;  // on the last stage only
      out.loss = micro.loss;      // on every stage (broadcast from the last)
      counters.stage_idle[stages_->rank()] += micro.idle_share().at(0);
    }
    ++counters.pipeline_steps;
  } else {
    // --grad-accum: the batch in chunks, one forward and backward each. Each
    // chunk's mean loss is weighted by its share of the batch, so the
    // gradients add up to those of the batch's mean loss; DDP all-reduces
    // only in the last chunk's backward.
    const int64_t rows = inputs.size(0);
    const int64_t chunks = std::min(options_.grad_accum, rows);
    // Note [unequal batches]: --skip-bad-images can leave the ranks' batches
    // of different sizes, and the ranks average their gradients. Each rank's
    // mean loss is then weighted by its share of the global batch (rows x
    // world / all rows), so that the average is the gradient of the whole
    // batch's mean loss, as in one process. One all-reduce of a scalar a
    // step, only with --skip-bad-images over several ranks.
    torch::Tensor share;
    if (options_.skip_bad_images && group_ && world_ > 1) {
      auto all_rows = torch::full({}, static_cast<double>(rows),
                                  torch::TensorOptions().dtype(torch::kFloat64).device(group_->wire_device()));
      group_->all_reduce(all_rows).wait();
      share = (static_cast<double>(rows * world_) / all_rows).to(device_);
    }
    auto input_chunks = inputs.tensor_split(chunks), target_chunks = targets.tensor_split(chunks);
    std::vector<torch::Tensor> logits;
    for (int64_t k = 0; k < chunks; ++k) {
      Held accumulate_only = k + 1 < chunks ? plan_->accumulate_only() : nullptr;
      torch::Tensor loss;
      {
        RECORD_USER_SCOPE("tandem::forward");
        optim::AutocastGuard autocast(device_.type(), amp_);  // forward and loss only
        const auto& x = input_chunks[k];
        logits.push_back(plan_->forward(x));
        loss = torch::nn::functional::cross_entropy(logits.back(), target_chunks[k], loss_options_);
        if (chunks > 1) loss = loss * (static_cast<double>(x.size(0)) / static_cast<double>(rows));
      }
      {
        RECORD_USER_SCOPE("tandem::backward");
        auto objective = share.defined() ? loss * share.to(loss.scalar_type()) : loss;
        (scaler_ ? scaler_->scale(objective) : objective).backward();
      }
      out.loss = k == 0 ? loss : out.loss.detach() + loss.detach();
    }
    out.logits = chunks == 1 ? logits.front() : torch::cat(logits);
  }
  {
    RECORD_USER_SCOPE("tandem::reduce");
    plan_->after_backward();  // the gradients averaged over the dp ranks
  }
  {
    RECORD_USER_SCOPE("tandem::optimizer");
    if (options_.clip_grad_norm > 0) {  // on the averaged, unscaled gradients (the same on every rank)
      if (scaler_) scaler_->unscale(optimizer);
      // The norm is summed over the ranks that hold disjoint pieces: the dp
      // ranks' shards, a pipeline's stages, or under a mesh both (the job).
      dist::ProcessGroup* holders = plan_->sharded() ? (stages_ ? job_group_.get() : group_.get()) : stages_.get();
      optim::clip_grad_norm(plan_->parameters(), options_.clip_grad_norm, holders);
    }
    if (scaler_) {  // unscale; skip the step on inf/NaN (on every rank alike); adjust the scale
      if (!scaler_->step(optimizer)) ++counters.skipped_steps;
      scaler_->update();
    } else {
      optimizer.step();
    }
  }
  return out;
}

EvalResult Trainer::evaluate() {
  TANDEM_CHECK(data_.test, "no evaluation data for ", options_.data, " (give --val-data)");
  Forward forward;
  if (pipeline_) {
    forward = [this](const torch::Tensor& x) {
      // Autocast on every kind of device the stages are on (the whole
      // batch goes through the stages in this thread).
      optim::AutocastGuard cpu(torch::kCPU, amp_);
      optim::AutocastGuard cuda(torch::kCUDA, amp_);
      return pipeline_->forward(x);
    };
  } else {
    forward = [this](const torch::Tensor& x) {
      optim::AutocastGuard autocast(device_.type(), amp_);
      bool nhwc = options_.channels_last && x.dim() == 4;
      auto input = nhwc ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
      return plan_->evaluation_forward(input);
    };
  }
  if (rank_pipeline_) {
    // Every stage passes every batch on; the last stage's result is the
    // job's (the others' forward returns no output, and they count nothing).
    // Under a mesh each replica pipeline takes its dp rank's share of the
    // test set, and the last stages' sums add up over their dp slice. FSDP x
    // pipeline: the stage's units gathered once for the whole evaluation,
    // as for a training step.
    forward = [this](const torch::Tensor& x) { return rank_pipeline_->forward(x); };
    Held gathered = plan_->whole_model(/*write_back=*/false);
    auto result = engine::evaluate(model_, *data_.test, options_.batch_size, device_, options_.workers,
                                   mesh_ ? group_.get() : nullptr, forward);
    gathered.reset();
    const auto wire = stages_->wire_device();
    auto values = torch::tensor({result.loss, result.accuracy, static_cast<double>(result.count)},
                                torch::kFloat64).to(wire);
    stages_->broadcast(values, stages_->size() - 1).wait();
    values = values.cpu();
    return {values[0].item<double>(), values[1].item<double>(), static_cast<int64_t>(values[2].item<double>())};
  }
  // Note [evaluation buffers]: each rank's BatchNorm statistics moved with
  // its own last batches since rank 0's were broadcast before the last
  // step. The ranks evaluate their shares of the test set with rank 0's, as
  // PyTorch's DDP does (it broadcasts buffers before every forward): the
  // reported score is then that of one model, the one --export-weights
  // writes (rank 0's); each rank's own scored up to 0.1% apart. The next
  // step broadcasts rank 0's before its forward anyway.
  if (group_ && world_ > 1 && !model_->buffers().empty()) dist::broadcast_buffers(*model_, *group_);
  return engine::evaluate(model_, *data_.test, options_.batch_size / world_, device_, options_.workers,
                          group_.get(), forward);
}

void Trainer::say(const std::string& line) const {
  if (log_ && options_.progress != "off") std::fprintf(log_, "%s\n", printable(line).c_str());
}

void Trainer::warn(const std::string& line) const {
  if (log_) std::fprintf(log_, "tandem: warning: %s\n", printable(line).c_str());
}


}  // namespace tandem::engine
