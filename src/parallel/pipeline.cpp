#include "tandem/parallel/pipeline.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <ATen/ThreadLocalState.h>
#include <c10/core/StreamGuard.h>

#include "pipeline_stage.h"
#include "task_thread.h"
#include "tandem/parallel/stage_split.h"
#include "tandem/util/check.h"
#include "tandem/util/message.h"

namespace tandem::parallel {

namespace {

// Thrown in a stage woken because another stage failed; never the error
// train_step reports.
struct Aborted : std::exception {
  const char* what() const noexcept override { return "pipeline stopped by another stage"; }
};

// Tensors handed from one stage thread to another, by micro-batch.
//
// Note [spinning hand-offs]: a stage that waits for a tensor first polls for
// up to PipelineOptions::spin, yielding its core to any other runnable
// thread between polls, and only then sleeps on the condition variable. A
// sleeping thread takes tens of microseconds to wake (about 0.1 ms on the
// project's VM), and under 1F1B, or GPipe with equal stages, the stages
// hand each other work just as the receiver falls idle, so every hand-off
// would put one wake-up on the step's critical path: m of them per stage
// boundary. A polling receiver sees the tensor within a microsecond or two.
class Mailbox {
 public:
  void spin_for(std::chrono::microseconds spin) { spin_ = spin; }
  void put(int64_t key, torch::Tensor t) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      items_[key] = std::move(t);
      version_.fetch_add(1, std::memory_order_release);
    }
    ready_.notify_all();
  }
  torch::Tensor take(int64_t key) {
    if (spin_.count() > 0) {
      const auto until = std::chrono::steady_clock::now() + spin_;
      while (true) {
        const auto seen = version_.load(std::memory_order_acquire);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (auto t = take_locked(key)) return *t;
        }
        bool timed_out = false;
        while (version_.load(std::memory_order_acquire) == seen) {
          if (std::chrono::steady_clock::now() >= until) {
            timed_out = true;
            break;
          }
          std::this_thread::yield();
        }
        if (timed_out) break;
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    ready_.wait(lock, [&] { return aborted_ || items_.count(key) > 0; });
    return *take_locked(key);
  }
  void abort() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      aborted_ = true;
      version_.fetch_add(1, std::memory_order_release);
    }
    ready_.notify_all();
  }

 private:
  // With mutex_ held: the tensor, nothing if it has not come, or Aborted.
  std::optional<torch::Tensor> take_locked(int64_t key) {
    if (aborted_) throw Aborted();
    auto found = items_.find(key);
    if (found == items_.end()) return std::nullopt;
    auto t = std::move(found->second);
    items_.erase(found);
    return t;
  }

  std::mutex mutex_;
  std::condition_variable ready_;
  std::map<int64_t, torch::Tensor> items_;
  std::atomic<uint64_t> version_{0};  // bumped by every put and by abort
  std::chrono::microseconds spin_{0};
  bool aborted_ = false;
};

// Piece k's links: forward[k] carries activations from piece k into k + 1,
// backward[k] gradients from k + 1 into k. Tensors are moved to the
// receiving piece's device (piece k runs on devices[k % S]) by the sender.
class ThreadLinks : public detail::StageLinks {
 public:
  ThreadLinks(std::vector<Mailbox>& forward, std::vector<Mailbox>& backward,
              const std::vector<torch::Device>& devices)
      : forward_(forward), backward_(backward), devices_(devices) {}
  torch::Tensor recv_activation(int64_t piece, int64_t i) override { return forward_[piece - 1].take(i); }
  void send_activation(int64_t piece, int64_t i, const torch::Tensor& t) override {
    forward_[piece].put(i, t.to(device_of(piece + 1)));
  }
  torch::Tensor recv_gradient(int64_t piece, int64_t i) override { return backward_[piece].take(i); }
  void send_gradient(int64_t piece, int64_t i, const torch::Tensor& g) override {
    backward_[piece - 1].put(i, g.to(device_of(piece - 1)));
  }

 private:
  const torch::Device& device_of(int64_t piece) const { return devices_[piece % devices_.size()]; }
  std::vector<Mailbox>& forward_;
  std::vector<Mailbox>& backward_;
  const std::vector<torch::Device>& devices_;
};

}  // namespace

Pipeline::Pipeline(models::Sequence model, const std::vector<int64_t>& sizes,
                   std::vector<torch::Device> devices, PipelineOptions options)
    : options_(std::move(options)), devices_(std::move(devices)) {
  TANDEM_CHECK(options_.micro_batches >= 1, "--micro-batches: expected a positive integer, got ",
               options_.micro_batches);
  // Names an unknown --schedule, or --virtual-stages without "interleaved".
  make_pipeline_schedule(options_.schedule, 1, 1, options_.virtual_stages);
  const auto chunks = static_cast<size_t>(options_.virtual_stages);
  TANDEM_CHECK(sizes.size() == devices_.size() * chunks, "pipeline: ", sizes.size(), " stages but ",
               devices_.size(), " devices",
               chunks > 1 ? " x --virtual-stages " + std::to_string(chunks) : std::string(),
               "; give one device per stage");
  std::vector<torch::Device> placement;  // piece k on devices_[k % S]
  for (size_t k = 0; k < sizes.size(); ++k) placement.push_back(devices_[k % devices_.size()]);
  chain_ = ModelParallel(split_sequence(model, sizes), std::move(placement));
  for (size_t s = 1; s < devices_.size(); ++s) workers_.push_back(std::make_unique<detail::TaskThread>());
}

Pipeline::~Pipeline() = default;

PipelineStep Pipeline::train_step(const torch::Tensor& input, const torch::Tensor& target,
                                  const PipelineLoss& loss, const LossScale& scale) {
  TANDEM_CHECK(input.defined() && input.dim() >= 1 && input.size(0) > 0,
               "pipeline: expected a batch with at least one row");
  TANDEM_CHECK(target.defined() && target.size(0) == input.size(0), "pipeline: ",
               input.size(0), " inputs but ", target.defined() ? target.size(0) : 0, " targets");
  const auto& devices = devices_;
  const size_t stages = devices.size();
  const size_t pieces = chain_->stages().size();
  auto sizes = detail::micro_batch_sizes(input.size(0), options_.micro_batches);
  const auto m = static_cast<int64_t>(sizes.size());
  auto schedule = make_pipeline_schedule(options_.schedule, static_cast<int64_t>(stages), m,
                                         options_.virtual_stages);

  std::vector<Mailbox> forward(pieces), backward(pieces);
  for (auto* boxes : {&forward, &backward}) {
    for (auto& box : *boxes) box.spin_for(options_.spin);
  }
  ThreadLinks links(forward, backward, devices);
  std::vector<detail::StageJob> jobs(stages);
  auto origin = std::chrono::steady_clock::now();
  for (size_t s = 0; s < stages; ++s) {
    auto& job = jobs[s];
    for (size_t k = s; k < pieces; k += stages) job.chunks.push_back(chain_->stages()[k]);
    job.stage = static_cast<int64_t>(s);
    job.stages = static_cast<int64_t>(stages);
    job.device = devices[s];
    job.actions = &schedule.actions[s];
    job.links = &links;
    job.origin = origin;
    job.autocast = options_.autocast;
    job.recompute = options_.recompute;
  }
  jobs.front().inputs = input.split_with_sizes(sizes);
  auto& last = jobs.back();
  last.targets = target.to(devices.back()).split_with_sizes(sizes);
  for (auto n : sizes) last.weights.push_back(double(n) / double(input.size(0)));
  last.loss = &loss;
  last.scale = &scale;

  std::vector<detail::StageOutcome> outcomes(stages);
  std::vector<std::exception_ptr> errors(stages);
  const at::ThreadLocalState caller;  // grad mode, autocast, ... for every stage thread
  // And the caller's current stream on each stage's device, so that stages
  // sharing a device share its stream: a hand-off between them is then
  // ordered on the device as it is on the host.
  std::vector<std::optional<c10::Stream>> streams;
  for (size_t s = 0; s < stages; ++s) streams.push_back(detail::current_stream(devices[s]));
  auto run = [&](size_t s) {
    try {
      at::ThreadLocalStateGuard state(caller);
      c10::OptionalStreamGuard stream(streams[s]);
      outcomes[s] = detail::run_stage(jobs[s]);
    } catch (...) {
      errors[s] = std::current_exception();
      for (auto& box : forward) box.abort();
      for (auto& box : backward) box.abort();
    }
  };
  for (size_t s = 1; s < stages; ++s) workers_[s - 1]->start([&run, s] { run(s); });
  run(0);  // stage 0 on the caller's thread
  for (auto& worker : workers_) worker->wait();
  for (size_t s = 0; s < stages; ++s) {  // the first error that is not a wake-up
    if (!errors[s]) continue;
    try {
      std::rethrow_exception(errors[s]);
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      TANDEM_FAIL("pipeline stage ", s, " (", devices[s].str(), "): ", message_of(e));
    }
  }

  PipelineStep step;
  step.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - origin).count();
  step.micro_batches = m;
  step.loss = outcomes.back().loss;
  step.output = torch::cat(outcomes.back().outputs, 0);
  for (auto& o : outcomes) step.stages.push_back(std::move(o.trace));
  return step;
}

}  // namespace tandem::parallel
