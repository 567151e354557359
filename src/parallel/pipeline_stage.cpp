#include "pipeline_stage.h"

#include <map>

#include <c10/core/DeviceGuard.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include "tandem/models/activation_checkpoint.h"
#include "tandem/optim/amp.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/check.h"

namespace tandem::parallel {

double PipelineStageTrace::busy() const {
  double total = 0;
  for (size_t i = 0; i < start.size(); ++i) total += end[i] - start[i];
  return total;
}

std::vector<double> PipelineStep::idle_share() const {
  std::vector<double> shares;
  for (const auto& s : stages) shares.push_back(seconds > 0 ? 1.0 - s.busy() / seconds : 0.0);
  return shares;
}

namespace detail {

std::vector<int64_t> micro_batch_sizes(int64_t n, int64_t m) {
  TANDEM_CHECK(m >= 1, "--micro-batches: expected a positive integer, got ", m);
  return scatter_sizes(n, static_cast<size_t>(m));
}

StageOutcome run_stage(StageJob& job) {
  using Clock = std::chrono::steady_clock;
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - job.origin).count(); };
  c10::OptionalDeviceGuard guard;
  if (job.device.is_cuda()) guard.reset_device(job.device);

  struct InFlight {
    torch::Tensor input;   // what F(i) consumed (requires grad past the first piece)
    torch::Tensor result;  // its output, or on the last piece its weighted loss
  };
  std::map<std::pair<int64_t, int64_t>, InFlight> in_flight;  // by (chunk, micro-batch)
  const auto chunks = static_cast<int64_t>(job.chunks.size());
  const int64_t last_piece = chunks * job.stages - 1;
  // First piece, when the batch requires grad: each micro-batch is computed
  // from a leaf of its own, and at the end one backward sends all their
  // gradients into the caller's graph (Note [first stage input]).
  std::vector<torch::Tensor> parts, leaves;
  StageOutcome outcome;
  // An action's interval: from when its input was there to when its compute
  // ended (CUDA runs asynchronously, so that waits for the kernels), before
  // its result is sent.
  auto record = [&](const PipelineAction& action, Clock::time_point begin) {
    if (job.device.is_cuda()) torch::cuda::synchronize(job.device.index());
    outcome.trace.actions.push_back(action);
    outcome.trace.start.push_back(since(begin));
    outcome.trace.end.push_back(since(Clock::now()));
  };
  outcome.outputs.resize(job.last() ? job.targets.size() : 0);
  // Where each chunk's last backward is in the stage's actions.
  const bool hooked = job.before_last_backward && *job.before_last_backward;
  std::vector<size_t> last_backward(static_cast<size_t>(chunks), job.actions->size());
  for (size_t a = 0; a < job.actions->size(); ++a) {
    const auto& action = (*job.actions)[a];
    if (action.op == PipelineOp::kBackward && action.chunk >= 0 && action.chunk < chunks) {
      last_backward[static_cast<size_t>(action.chunk)] = a;
    }
  }
  for (size_t a = 0; a < job.actions->size(); ++a) {
    const auto& action = (*job.actions)[a];
    const int64_t i = action.micro_batch, c = action.chunk;
    TANDEM_CHECK(c >= 0 && c < chunks, "pipeline: an action of chunk ", c, " on a stage of ",
                 chunks, " chunk(s)");
    const int64_t piece = c * job.stages + job.stage;
    const bool first = piece == 0, last = piece == last_piece;
    auto& module = job.chunks[c];
    torch::Tensor x;
    if (action.op == PipelineOp::kForward) {
      if (first) {
        x = job.inputs.at(i).to(job.device);
        if (x.requires_grad()) {
          parts.push_back(x);
          x = x.detach().requires_grad_(true);
          leaves.push_back(x);
        }
      } else {
        x = job.links->recv_activation(piece, i);
        if (x.is_floating_point()) x.requires_grad_(true);
      }
      auto begin = Clock::now();
      optim::AutocastGuard autocast(job.device.type(), job.autocast);  // forward and loss only
      torch::Tensor y;
      if (job.recompute) {  // only x is kept; the forward runs again before the backward
        y = models::checkpoint_activations([&module](const torch::Tensor& in) { return module->forward(in); },
                                           x, module->buffers());
      } else {
        y = module->forward(x);
      }
      torch::Tensor result;
      if (last) {
        result = (*job.loss)(y, job.targets.at(i)) * job.weights.at(i);
        outcome.loss = outcome.loss.defined() ? outcome.loss + result.detach() : result.detach();
        outcome.outputs[i] = y.detach();
      } else {
        result = y;
      }
      record(action, begin);
      if (!last) job.links->send_activation(piece, i, y.detach());
      in_flight[{c, i}] = InFlight{x, result};
      outcome.trace.max_in_flight =
          std::max<int64_t>(outcome.trace.max_in_flight, static_cast<int64_t>(in_flight.size()));
    } else {
      auto found = in_flight.find({c, i});
      TANDEM_CHECK(found != in_flight.end(), "pipeline: backward of micro-batch ", i,
                   " before its forward");
      torch::Tensor grad;
      if (!last) grad = job.links->recv_gradient(piece, i);
      if (hooked && a == last_backward[static_cast<size_t>(c)]) (*job.before_last_backward)(c);
      auto begin = Clock::now();
      auto& f = found->second;
      if (f.result.requires_grad()) {
        if (last) {
          (job.scale && *job.scale ? (*job.scale)(f.result) : f.result).backward();
        } else {
          torch::autograd::backward({f.result}, {grad});
        }
      }
      record(action, begin);
      if (!first) {
        auto g = f.input.grad();
        job.links->send_gradient(piece, i, g.defined() ? g : torch::zeros_like(f.input));
      }
      in_flight.erase(found);
    }
  }
  TANDEM_CHECK(in_flight.empty(), "pipeline: ", in_flight.size(),
               " micro-batch(es) ran forward but not backward");
  // Note [first stage input]: backward through the batch's split, once per
  // micro-batch, would rebuild a zero gradient of the whole batch each time
  // (O(m) work per micro-batch) and fail on the second pass if the batch is
  // the output of a graph that frees its saved tensors. One backward with
  // every micro-batch's gradient does each once.
  if (!parts.empty()) {
    std::vector<torch::Tensor> grads;
    for (auto& leaf : leaves) grads.push_back(leaf.grad().defined() ? leaf.grad() : torch::zeros_like(leaf));
    torch::autograd::backward(parts, grads);
  }
  return outcome;
}

}  // namespace detail
}  // namespace tandem::parallel
