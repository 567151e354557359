#include <algorithm>
#include <map>

#include <c10/core/DeviceGuard.h>

#include "pipeline_stage.h"
#include "tandem/dist/communication_error.h"
#include "tandem/optim/amp.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/util/check.h"
#include "tandem/util/message.h"

namespace tandem::parallel {

namespace {

// Note [pipeline messages]: each tensor goes as two messages, a header of
// kHeader int64s (dtype, number of dimensions, sizes) and then the data, so
// the receiver needs no knowledge of the sender's stage. Tags keep the
// messages of different micro-batches, boundaries and directions apart:
// tag = 4 * (k * M + micro-batch) + 2 * (0 forward, 1 backward) + (0
// header, 1 data), k the boundary between pieces k and k + 1. With Gloo
// the tensors travel through host memory; with NCCL they stay on the
// device. NCCL ignores tags, and sends and receives between two ranks run
// in order on one stream per communicator, a send of more than NCCL's
// buffer waiting for its receive; so every group carries messages in one
// direction between any two ranks, in the order both sides run them (every
// stage runs the forwards in the same order, and the backwards):
// activations from stage s to s + 1 over the stages' group, gradients back
// over a duplicate of it (1F1B has both neighbours send, an activation
// forward and a gradient back, before they receive, which on one
// communicator would wait on each other for ever), and, interleaved, the
// last stage's activations to the first and the first's gradients to the
// last over two more. A message to this rank itself (one stage of several
// chunks) is handed over in memory.
constexpr int64_t kHeader = 10;

struct Groups {
  dist::ProcessGroup *activations, *gradients, *wrap_activations, *wrap_gradients;
};

class RankLinks : public detail::StageLinks {
 public:
  RankLinks(Groups groups, torch::Device device, int64_t micro_batches)
      : groups_(groups),
        device_(device),
        wire_(groups.activations->backend() == "nccl" ? device : torch::Device(torch::kCPU)),
        micro_batches_(micro_batches) {}

  torch::Tensor recv_activation(int64_t piece, int64_t i) override { return recv(piece - 1, i, 0); }
  void send_activation(int64_t piece, int64_t i, const torch::Tensor& t) override {
    send(piece, i, 0, t);
  }
  torch::Tensor recv_gradient(int64_t piece, int64_t i) override { return recv(piece, i, 1); }
  void send_gradient(int64_t piece, int64_t i, const torch::Tensor& g) override {
    send(piece - 1, i, 1, g);
  }

  // Note [pipeline sends]: every send of the step is waited for here, at
  // its end, and its buffers (the header, the activation or gradient sent)
  // live until then: a stage holds all its micro-batches' messages at its
  // peak, which tandem plan counts.
  void finish() {
    for (auto& [work, tensors] : pending_) work.wait();
    pending_.clear();
  }

 private:
  int64_t rank() const { return groups_.activations->rank(); }
  int64_t stages() const { return groups_.activations->size(); }
  int tag(int64_t boundary, int64_t i, int direction, int part) const {
    return static_cast<int>(4 * (boundary * micro_batches_ + i) + 2 * direction + part);
  }
  // The group and peer of boundary k (between pieces k and k + 1) in a
  // direction, seen from this rank.
  std::pair<dist::ProcessGroup*, int64_t> route(int64_t boundary, int direction) const {
    const int64_t sender = boundary % stages();  // piece k's stage
    const bool wrap = sender == stages() - 1;    // into stage 0, one chunk on
    const int64_t low = sender, high = wrap ? 0 : sender + 1;
    auto* group = direction == 0 ? (wrap ? groups_.wrap_activations : groups_.activations)
                                 : (wrap ? groups_.wrap_gradients : groups_.gradients);
    const int64_t peer = rank() == low ? high : low;
    return {group, peer};
  }
  void send(int64_t boundary, int64_t i, int direction, const torch::Tensor& t) {
    auto [group, peer] = route(boundary, direction);
    if (peer == rank()) {
      local_[{boundary, 2 * i + direction}] = t.to(device_);
      return;
    }
    TANDEM_CHECK(t.dim() <= kHeader - 2, "pipeline: cannot send a tensor of ", t.dim(),
                 " dimensions (at most ", kHeader - 2, ")");
    auto header = torch::zeros({kHeader}, torch::kInt64);
    header[0] = static_cast<int64_t>(t.scalar_type());
    header[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
    header = header.to(wire_);
    auto data = t.to(wire_).contiguous();
    auto w1 = group->send(header, peer, tag(boundary, i, direction, 0));
    pending_.push_back({w1, {header}});
    auto w2 = group->send(data, peer, tag(boundary, i, direction, 1));
    pending_.push_back({w2, {data}});
  }
  torch::Tensor recv(int64_t boundary, int64_t i, int direction) {
    auto [group, peer] = route(boundary, direction);
    if (peer == rank()) {
      auto found = local_.find({boundary, 2 * i + direction});
      TANDEM_CHECK(found != local_.end(), "pipeline: micro-batch ", i, "'s ",
                   direction == 0 ? "activation" : "gradient", " between pieces ", boundary,
                   " and ", boundary + 1, " was not sent before it was needed");
      auto t = std::move(found->second);
      local_.erase(found);
      return t;
    }
    auto header = torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire_));
    group->recv(header, peer, tag(boundary, i, direction, 0)).wait();
    header = header.cpu();
    auto h = header.accessor<int64_t, 1>();
    TANDEM_CHECK(h[1] >= 0 && h[1] <= kHeader - 2 && h[0] >= 0 &&
                     h[0] < static_cast<int64_t>(torch::ScalarType::NumOptions),
                 "pipeline: malformed header from rank ", peer);
    std::vector<int64_t> shape(h.data() + 2, h.data() + 2 + h[1]);
    for (auto size : shape) TANDEM_CHECK(size >= 0, "pipeline: malformed header from rank ", peer);
    auto data = torch::empty(shape, torch::TensorOptions()
                                        .dtype(static_cast<torch::ScalarType>(h[0]))
                                        .device(wire_));
    group->recv(data, peer, tag(boundary, i, direction, 1)).wait();
    return data.to(device_);
  }

  Groups groups_;
  torch::Device device_, wire_;
  int64_t micro_batches_;
  std::vector<std::pair<dist::Work, std::vector<torch::Tensor>>> pending_;
  std::map<std::pair<int64_t, int64_t>, torch::Tensor> local_;  // to this rank itself
};

}  // namespace

DistributedPipeline::DistributedPipeline(models::Sequence stage, torch::Device device,
                                         std::shared_ptr<dist::ProcessGroup> group,
                                         PipelineOptions options)
    : DistributedPipeline(std::vector<models::Sequence>{std::move(stage)}, device, std::move(group),
                          std::move(options)) {}

DistributedPipeline::DistributedPipeline(std::vector<models::Sequence> chunks, torch::Device device,
                                         std::shared_ptr<dist::ProcessGroup> group,
                                         PipelineOptions options)
    : chunks_(std::move(chunks)), device_(device), group_(std::move(group)), options_(std::move(options)) {
  // Every check before the first collective, so that ranks refuse alike.
  TANDEM_CHECK(group_ != nullptr, "distributed pipeline: no process group");
  TANDEM_CHECK(options_.micro_batches >= 1, "--micro-batches: expected a positive integer, got ",
               options_.micro_batches);
  // Names an unknown --schedule, or --virtual-stages without "interleaved".
  make_pipeline_schedule(options_.schedule, 1, 1, options_.virtual_stages);
  TANDEM_CHECK(static_cast<int64_t>(chunks_.size()) == options_.virtual_stages,
               "distributed pipeline: ", chunks_.size(), " chunk(s) on this rank but --virtual-stages ",
               options_.virtual_stages);
  for (const auto& chunk : chunks_) {
    TANDEM_CHECK(chunk.ptr() != nullptr, "distributed pipeline: a chunk is an empty module");
  }
  gradients_ = group_->duplicate("pipeline-gradients");  // Note [pipeline messages]
  if (chunks_.size() > 1) {
    wrap_activations_ = group_->duplicate("pipeline-wrap-activations");
    wrap_gradients_ = group_->duplicate("pipeline-wrap-gradients");
  }
  for (auto& chunk : chunks_) chunk->to(device_);
}

DistributedPipeline::~DistributedPipeline() = default;

torch::Tensor DistributedPipeline::forward(const torch::Tensor& input) {
  const int64_t s = stage_index(), stages = stage_count();
  const auto chunks = static_cast<int64_t>(chunks_.size());
  const int64_t pieces = stages * chunks;
  RankLinks links(Groups{group_.get(), gradients_.get(), wrap_activations_.get(), wrap_gradients_.get()},
                  device_, 1);
  c10::OptionalDeviceGuard guard;
  if (device_.is_cuda()) guard.reset_device(device_);
  torch::Tensor x;
  try {
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t piece = c * stages + s;
      if (piece == 0) {
        TANDEM_CHECK(input.defined(), "pipeline stage 0: expected the batch's inputs");
        x = input.to(device_);
      } else {
        x = links.recv_activation(piece, 0);
      }
      optim::AutocastGuard autocast(device_.type(), options_.autocast);
      x = chunks_[c]->forward(x);
      if (piece + 1 < pieces) links.send_activation(piece, 0, x.detach());
    }
    links.finish();
  } catch (const std::exception& e) {
    dist::rethrow_with_context(tandem::detail::str_cat("pipeline stage ", s, " (rank ", group_->job_ranks().at(s), ", ", device_.str(), "), forward: "),
                               e);
  }
  return s + 1 == stages ? x : torch::Tensor();
}

int64_t DistributedPipeline::stage_index() const { return group_->rank(); }
int64_t DistributedPipeline::stage_count() const { return group_->size(); }

PipelineStep DistributedPipeline::train_step(const torch::Tensor& input,
                                             const torch::Tensor& target,
                                             const PipelineLoss& loss, const LossScale& scale,
                                             int64_t rows) {
  const int64_t s = stage_index(), stages = stage_count();
  // The batch's rows, where this stage can know them: a short batch (the
  // last of an epoch, or one --skip-bad-images shrank) takes one
  // micro-batch per row, on every stage alike.
  auto rows_of = [](const torch::Tensor& t) { return t.defined() && t.dim() >= 1 ? t.size(0) : int64_t(0); };
  if (rows <= 0) rows = rows_of(input) > 0 ? rows_of(input) : rows_of(target);
  TANDEM_CHECK(rows_of(input) == 0 || rows_of(target) == 0 || rows_of(input) == rows_of(target), "pipeline stage ",
               s, ": ", rows_of(input), " inputs but ", rows_of(target), " targets");
  const int64_t m = rows > 0 ? std::min(options_.micro_batches, rows) : options_.micro_batches;
  auto schedule = make_pipeline_schedule(options_.schedule, stages, m, options_.virtual_stages);
  RankLinks links(Groups{group_.get(), gradients_.get(), wrap_activations_.get(), wrap_gradients_.get()},
                  device_, m);
  detail::StageJob job;
  job.chunks = chunks_;
  job.stage = s;
  job.stages = stages;
  job.device = device_;
  job.actions = &schedule.actions[s];
  job.links = &links;
  job.origin = std::chrono::steady_clock::now();
  job.autocast = options_.autocast;
  job.recompute = options_.recompute;
  job.before_last_backward = &options_.before_last_backward;
  auto cut = [&](const torch::Tensor& t, const char* what) {
    TANDEM_CHECK(t.defined() && t.dim() >= 1, "pipeline stage ", s, ": expected the batch's ",
                 what);
    TANDEM_CHECK(t.size(0) >= m, "pipeline: a batch of ", t.size(0),
                 " rows cannot be cut into --micro-batches ", m);
    return t.split_with_sizes(detail::micro_batch_sizes(t.size(0), m));
  };
  if (job.first()) job.inputs = cut(input, "inputs");
  if (job.last()) {
    job.targets = cut(target.defined() ? target.to(device_) : target, "targets");
    for (const auto& t : job.targets) job.weights.push_back(double(t.size(0)) / double(target.size(0)));
    job.loss = &loss;
    job.scale = &scale;
  }
  detail::StageOutcome outcome;
  try {
    outcome = detail::run_stage(job);
    links.finish();
  } catch (const std::exception& e) {
    dist::rethrow_with_context(tandem::detail::str_cat("pipeline stage ", s, " (rank ", group_->job_ranks().at(s), ", ", device_.str(), "): "), e);
  }

  PipelineStep step;
  step.micro_batches = m;
  // Every rank learns the loss from the last stage.
  const auto wire = group_->backend() == "nccl" ? device_ : torch::Device(torch::kCPU);
  auto value = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(wire));
  if (job.last()) value.fill_(outcome.loss.item<double>());
  group_->broadcast(value, stages - 1).wait();
  step.loss = job.last() ? outcome.loss : value.cpu()[0];
  if (job.last()) step.output = torch::cat(outcome.outputs, 0);
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.origin).count();
  step.stages.push_back(std::move(outcome.trace));
  return step;
}

}  // namespace tandem::parallel
