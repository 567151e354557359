#include <c10/core/DeviceGuard.h>

#include "pipeline_stage.h"
#include "tandem/parallel/pipeline.h"
#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

// Note [pipeline messages]: each tensor goes as two messages, a header of
// kHeader int64s (dtype, number of dimensions, sizes) and then the data, so
// the receiver needs no knowledge of the sender's stage. Tags keep the
// messages of different micro-batches and directions apart:
// tag = 4 * micro-batch + 2 * (0 forward, 1 backward) + (0 header, 1 data).
// With Gloo the tensors travel through host memory; with NCCL they stay on
// the device. Gradients go over a group of their own (a duplicate of the
// stages' group): with NCCL, sends and receives between two ranks run in
// order on one stream per communicator, and a send of more than NCCL's
// buffer waits for its receive; 1F1B has both neighbours send (an
// activation forward, a gradient back) before they receive, which on one
// communicator would wait on each other for ever.
constexpr int64_t kHeader = 10;

class RankLinks : public detail::StageLinks {
 public:
  RankLinks(dist::ProcessGroup& forward, dist::ProcessGroup& backward, torch::Device device)
      : groups_{&forward, &backward},
        device_(device),
        wire_(forward.backend() == "nccl" ? device : torch::Device(torch::kCPU)) {}

  torch::Tensor recv_activation(int64_t i) override { return recv(rank() - 1, i, 0); }
  void send_activation(int64_t i, const torch::Tensor& t) override { send(rank() + 1, i, 0, t); }
  torch::Tensor recv_gradient(int64_t i) override { return recv(rank() + 1, i, 1); }
  void send_gradient(int64_t i, const torch::Tensor& g) override { send(rank() - 1, i, 1, g); }

  // Waits for every send of the step (their buffers live until then).
  void finish() {
    for (auto& [work, tensors] : pending_) work.wait();
    pending_.clear();
  }

 private:
  int64_t rank() const { return groups_[0]->rank(); }
  static int tag(int64_t i, int direction, int part) {
    return static_cast<int>(4 * i + 2 * direction + part);
  }
  void send(int64_t peer, int64_t i, int direction, const torch::Tensor& t) {
    TANDEM_CHECK(t.dim() <= kHeader - 2, "pipeline: cannot send a tensor of ", t.dim(),
                 " dimensions (at most ", kHeader - 2, ")");
    auto header = torch::zeros({kHeader}, torch::kInt64);
    header[0] = static_cast<int64_t>(t.scalar_type());
    header[1] = t.dim();
    for (int64_t d = 0; d < t.dim(); ++d) header[2 + d] = t.size(d);
    header = header.to(wire_);
    auto data = t.to(wire_).contiguous();
    auto& group = *groups_[direction];
    auto w1 = group.send(header, peer, tag(i, direction, 0));
    pending_.push_back({w1, {header}});
    auto w2 = group.send(data, peer, tag(i, direction, 1));
    pending_.push_back({w2, {data}});
  }
  torch::Tensor recv(int64_t peer, int64_t i, int direction) {
    auto header = torch::empty({kHeader}, torch::TensorOptions().dtype(torch::kInt64).device(wire_));
    auto& group = *groups_[direction];
    group.recv(header, peer, tag(i, direction, 0)).wait();
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
    group.recv(data, peer, tag(i, direction, 1)).wait();
    return data.to(device_);
  }

  dist::ProcessGroup* groups_[2];  // activations forward, gradients back
  torch::Device device_, wire_;
  std::vector<std::pair<dist::Work, std::vector<torch::Tensor>>> pending_;
};

}  // namespace

DistributedPipeline::DistributedPipeline(models::Sequence stage, torch::Device device,
                                         std::shared_ptr<dist::ProcessGroup> group,
                                         PipelineOptions options)
    : stage_(std::move(stage)), device_(device), group_(std::move(group)), options_(std::move(options)) {
  TANDEM_CHECK(group_ != nullptr, "distributed pipeline: no process group");
  gradients_ = group_->duplicate("pipeline-gradients");  // Note [pipeline messages]
  TANDEM_CHECK(options_.micro_batches >= 1, "--micro-batches: expected a positive integer, got ",
               options_.micro_batches);
  make_pipeline_schedule(options_.schedule, 1, 1);  // names --schedule if unknown
  stage_->to(device_);
}

DistributedPipeline::~DistributedPipeline() = default;

int64_t DistributedPipeline::stage_index() const { return group_->rank(); }
int64_t DistributedPipeline::stage_count() const { return group_->size(); }

PipelineStep DistributedPipeline::train_step(const torch::Tensor& input,
                                             const torch::Tensor& target,
                                             const PipelineLoss& loss, const LossScale& scale) {
  const int64_t s = stage_index(), stages = stage_count();
  const int64_t m = options_.micro_batches;
  auto schedule = make_pipeline_schedule(options_.schedule, stages, m);
  RankLinks links(*group_, *gradients_, device_);
  detail::StageJob job;
  job.module = stage_;
  job.device = device_;
  job.first = s == 0;
  job.last = s + 1 == stages;
  job.actions = &schedule.actions[s];
  job.links = &links;
  job.origin = std::chrono::steady_clock::now();
  job.autocast = options_.autocast;
  job.recompute = options_.recompute;
  auto cut = [&](const torch::Tensor& t, const char* what) {
    TANDEM_CHECK(t.defined() && t.dim() >= 1, "pipeline stage ", s, ": expected the batch's ",
                 what);
    TANDEM_CHECK(t.size(0) >= m, "pipeline: a batch of ", t.size(0),
                 " rows cannot be cut into --micro-batches ", m);
    return t.split_with_sizes(detail::micro_batch_sizes(t.size(0), m));
  };
  if (job.first) job.inputs = cut(input, "inputs");
  if (job.last) {
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
    TANDEM_FAIL("pipeline stage ", s, " (rank ", s, ", ", device_.str(), "): ", e.what());
  }

  PipelineStep step;
  step.micro_batches = m;
  // Every rank learns the loss from the last stage.
  const auto wire = group_->backend() == "nccl" ? device_ : torch::Device(torch::kCPU);
  auto value = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(wire));
  if (job.last) value.fill_(outcome.loss.item<double>());
  group_->broadcast(value, stages - 1).wait();
  step.loss = job.last ? outcome.loss : value.cpu()[0];
  if (job.last) step.output = torch::cat(outcome.outputs, 0);
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - job.origin).count();
  step.stages.push_back(std::move(outcome.trace));
  return step;
}

}  // namespace tandem::parallel
