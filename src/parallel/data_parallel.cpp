#include "tandem/parallel/data_parallel.h"

#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include "task_thread.h"
#include "tandem/util/check.h"
#include "tandem/util/cuda_module.h"
#include "tandem/util/message.h"
#include "tandem/util/parse.h"

namespace tandem::parallel {

namespace {

std::string shape_of(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

}  // namespace

std::vector<int64_t> scatter_sizes(int64_t n, size_t k) {
  TANDEM_CHECK(k > 0, "scatter: no devices");
  TANDEM_CHECK(n >= 0, "scatter: negative size ", n);
  auto parts = std::min<int64_t>(static_cast<int64_t>(k), n);
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < parts; ++i) sizes.push_back(n / parts + (i < n % parts ? 1 : 0));
  return sizes;
}

std::vector<torch::Tensor> scatter(const torch::Tensor& input,
                                   const std::vector<torch::Device>& devices) {
  TANDEM_CHECK(input.defined() && input.dim() >= 1 && input.size(0) > 0,
               "scatter: expected a batch with at least one row, got ",
               input.defined() ? shape_of(input) : std::string("an undefined tensor"));
  std::vector<torch::Tensor> pieces;
  int64_t offset = 0;
  auto sizes = scatter_sizes(input.size(0), devices.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    pieces.push_back(input.narrow(0, offset, sizes[i]).to(devices[i]));  // differentiable
    offset += sizes[i];
  }
  return pieces;
}

torch::Tensor gather(const std::vector<torch::Tensor>& outputs, const torch::Device& device) {
  TANDEM_CHECK(!outputs.empty(), "gather: no outputs");
  std::vector<torch::Tensor> moved;
  for (const auto& o : outputs) moved.push_back(o.to(device));  // differentiable
  return torch::cat(moved, 0);
}

namespace {

// parallel_apply's body: replica 0 on this thread, replica i > 0 on
// threads[i - 1] when given, else on a new thread.
std::vector<torch::Tensor> apply_replicas(std::vector<torch::nn::AnyModule>& replicas,
                                          const std::vector<torch::Tensor>& inputs,
                                          const std::vector<torch::Device>& devices,
                                          const std::vector<std::unique_ptr<detail::TaskThread>>* threads) {
  TANDEM_CHECK(inputs.size() <= replicas.size() && inputs.size() <= devices.size(),
               "parallel_apply: ", inputs.size(), " inputs for ", replicas.size(), " replicas on ",
               devices.size(), " devices");
  const size_t n = inputs.size();
  std::vector<torch::Tensor> outputs(n);
  std::vector<std::exception_ptr> errors(n);
  // Grad mode, autocast and the rest of the caller's thread-local state go
  // with each replica's thread, and so does the caller's current stream on
  // each device (as in PyTorch's parallel_apply).
  const at::ThreadLocalState caller;
  std::vector<std::optional<c10::Stream>> streams;
  for (size_t i = 0; i < n; ++i) streams.push_back(detail::current_stream(devices[i]));
  auto run = [&](size_t i) {
    try {
      at::ThreadLocalStateGuard state(caller);
      c10::OptionalStreamGuard guard(streams[i]);
      outputs[i] = replicas[i].forward(inputs[i]);
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> spawned;
  for (size_t i = 1; i < n; ++i) {
    if (threads) {
      (*threads)[i - 1]->start([&run, i] { run(i); });
    } else {
      spawned.emplace_back([&run, i] {
        at::init_num_threads();  // Note [intra-op settings of new threads] in pipeline.h
        run(i);
      });
    }
  }
  if (n > 0) run(0);
  if (threads) {
    for (size_t i = 1; i < n; ++i) (*threads)[i - 1]->wait();
  }
  for (auto& t : spawned) t.join();
  for (size_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    try {
      std::rethrow_exception(errors[i]);
    } catch (const std::exception& e) {
      TANDEM_FAIL("replica ", i, " on ", devices[i].str(), " failed: ", message_of(e));
    }
  }
  return outputs;
}

}  // namespace

std::vector<torch::Tensor> parallel_apply(std::vector<torch::nn::AnyModule>& replicas,
                                          const std::vector<torch::Tensor>& inputs,
                                          const std::vector<torch::Device>& devices) {
  return apply_replicas(replicas, inputs, devices, nullptr);
}

// ---- ReplicaSet ---------------------------------------------------------------

namespace {

// Adds a replica parameter's gradient into the original's, then clears it.
struct SumIntoOriginal : torch::autograd::FunctionPostHook {
  SumIntoOriginal(torch::Tensor replica, torch::Tensor original, std::shared_ptr<std::mutex> lock)
      : replica_(std::move(replica)), original_(std::move(original)), lock_(std::move(lock)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    auto grad = replica_.grad();
    if (!grad.defined()) return outputs;
    torch::NoGradGuard no_grad;
    auto moved = grad.to(original_.device());
    {
      std::lock_guard<std::mutex> hold(*lock_);
      if (original_.grad().defined()) {
        original_.mutable_grad().add_(moved);
      } else {
        // The replica's gradient is its own (AccumulateGrad steals only
        // unshared buffers) and is released below, so it can be taken.
        original_.mutable_grad() = moved;
      }
    }
    replica_.mutable_grad().reset();
    return outputs;
  }
  torch::Tensor replica_, original_;
  std::shared_ptr<std::mutex> lock_;
};

}  // namespace

struct ReplicaSet::Shared {
  // Keeps the replicas' gradient accumulators (and so the hooks on them)
  // alive; a parameter holds its accumulator only weakly.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;
};

ReplicaSet::ReplicaSet(torch::nn::AnyModule module, std::vector<torch::Device> devices)
    : module_(std::move(module)), devices_(std::move(devices)), shared_(std::make_shared<Shared>()) {
  TANDEM_CHECK(!module_.is_empty(), "DataParallel: no module");
  TANDEM_CHECK(!devices_.empty(), "DataParallel: no devices");
  auto originals = module_.ptr()->parameters();
  std::vector<std::shared_ptr<std::mutex>> locks;
  for (size_t j = 0; j < originals.size(); ++j) locks.push_back(std::make_shared<std::mutex>());
  for (const auto& device : devices_) {
    torch::nn::AnyModule replica;
    try {
      replica = module_.clone(device);
    } catch (const std::exception& e) {
      TANDEM_FAIL("DataParallel: cannot copy module ", module_.ptr()->name(), " to ", device.str(),
                  ": ", message_of(e),
                  " (a module must derive from torch::nn::Cloneable to be replicated)");
    }
    auto params = replica.ptr()->parameters();
    TANDEM_CHECK(params.size() == originals.size(), "DataParallel: the copy of ",
                 module_.ptr()->name(), " has ", params.size(), " parameters, the original ",
                 originals.size());
    for (size_t j = 0; j < params.size(); ++j) {
      // clone() re-creates parameters with requires_grad set; a frozen
      // original keeps its replicas frozen.
      params[j].set_requires_grad(originals[j].requires_grad());
      if (!params[j].requires_grad()) continue;
      auto accumulator = torch::autograd::impl::grad_accumulator(params[j]);
      accumulator->add_post_hook(std::make_unique<SumIntoOriginal>(params[j], originals[j], locks[j]));
      shared_->accumulators.push_back(std::move(accumulator));
    }
    replicas_.push_back(std::move(replica));
  }
  for (size_t i = 1; i < devices_.size(); ++i) threads_.push_back(std::make_unique<detail::TaskThread>());
}

ReplicaSet::~ReplicaSet() = default;

std::vector<torch::nn::AnyModule>& ReplicaSet::refresh(size_t count) {
  torch::NoGradGuard no_grad;
  auto& original = *module_.ptr();
  auto params = original.parameters();
  auto buffers = original.buffers();
  for (size_t i = 0; i < count && i < replicas_.size(); ++i) {
    auto& replica = *replicas_[i].ptr();
    auto rp = replica.parameters();
    auto rb = replica.buffers();
    // Through .data(): the values change but not the replica's version
    // counter, whose bump would fail the backward of a graph that saved the
    // parameter (two forwards before one backward). Between those forwards
    // the values are the same, unless the optimizer stepped in between.
    for (size_t j = 0; j < rp.size(); ++j) rp[j].data().copy_(params[j]);
    for (size_t j = 0; j < rb.size(); ++j) rb[j].copy_(buffers[j]);
    replica.train(original.is_training());
  }
  return replicas_;
}

void ReplicaSet::keep_buffers() {
  torch::NoGradGuard no_grad;
  auto buffers = module_.ptr()->buffers();
  auto first = replicas_[0].ptr()->buffers();
  for (size_t j = 0; j < buffers.size(); ++j) buffers[j].copy_(first[j]);
}

std::vector<torch::Tensor> ReplicaSet::forward(const std::vector<torch::Tensor>& inputs) {
  std::unique_lock<std::mutex> one_at_a_time(running_, std::try_to_lock);
  TANDEM_CHECK(one_at_a_time.owns_lock(), "DataParallel over ", devices_.size(),
               " devices: forward called while another forward of the same module runs; "
               "its replicas run one forward at a time");
  refresh(inputs.size());
  auto outputs = apply_replicas(replicas_, inputs, devices_, &threads_);
  keep_buffers();
  return outputs;
}

// ---- DataParallel ---------------------------------------------------------------

namespace {

torch::Tensor run_data_parallel(ReplicaSet& replicas, const torch::Tensor& input,
                                const torch::Device& output_device, bool trace) {
  const auto& devices = replicas.devices();
  auto pieces = scatter(input, devices);
  auto outputs = replicas.forward(pieces);
  if (trace) {
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::fprintf(stderr, "[data parallel] replica %zu on %s: input %s -> output %s\n", i,
                   devices[i].str().c_str(), shape_of(pieces[i]).c_str(), shape_of(outputs[i]).c_str());
    }
  }
  return gather(outputs, output_device);
}

std::vector<torch::Device> default_devices() {
  std::vector<torch::Device> devices;
  for (size_t i = 0, n = torch::cuda::device_count(); i < n; ++i) {
    devices.emplace_back(torch::kCUDA, static_cast<c10::DeviceIndex>(i));
  }
  if (devices.empty()) devices.emplace_back(torch::kCPU);
  return devices;
}

}  // namespace

DataParallelImpl::DataParallelImpl(torch::nn::AnyModule module, DataParallelOptions options)
    : module_(std::move(module)), options_(std::move(options)) {
  TANDEM_CHECK(!module_.is_empty(), "DataParallel: no module");
  if (options_.devices.empty()) options_.devices = default_devices();
  if (!options_.output_device) options_.output_device = options_.devices[0];
  register_module("module", module_.ptr());  // parameters are "module.<name>", as in PyTorch
  replicas_ = std::make_unique<ReplicaSet>(module_, options_.devices);
}

torch::Tensor DataParallelImpl::forward(const torch::Tensor& input) {
  return run_data_parallel(*replicas_, input, *options_.output_device, options_.trace);
}

torch::Tensor data_parallel(torch::nn::AnyModule module, const torch::Tensor& input,
                            const std::vector<torch::Device>& devices,
                            std::optional<torch::Device> output_device) {
  ReplicaSet replicas(std::move(module), devices);  // hooks outlive it (Shared)
  return run_data_parallel(replicas, input, output_device.value_or(devices.at(0)), false);
}

torch::Device parse_device_name(const std::string& item, const std::string& flag,
                                const std::string& whole, const std::string& expected) {
  std::optional<torch::Device> device;
  try {
    device.emplace(item);
  } catch (const std::exception&) {
  }
  TANDEM_CHECK_USAGE(device && (device->is_cpu() || device->is_cuda()), flag, ": expected ", expected,
                     ", got '", whole, "'");
  // libtorch takes "cpu:1" and runs it on the one CPU, so the index would
  // be ignored where the user meant something by it.
  TANDEM_CHECK_USAGE(!(device->is_cpu() && device->has_index()), flag, ": expected ", expected, ", got '", whole,
                     "' (the CPU is one device: cpu, without an index)");
  return *device;
}

torch::Device parse_one_device(const std::string& item, const std::string& flag,
                               const std::string& whole, const std::string& expected) {
  const torch::Device device = parse_device_name(item, flag, whole, expected);
  if (device.is_cuda()) {
    const std::string why = cuda::load_error();  // Note [CUDA as a module]
    TANDEM_CHECK(torch::cuda::is_available(), flag, " ", whole, ": no CUDA device is available on this machine",
                 why.empty() ? "" : " (", why, why.empty() ? "" : ")");
    TANDEM_CHECK(!device.has_index() || device.index() < static_cast<int>(torch::cuda::device_count()),
                 flag, " ", whole, ": only ", torch::cuda::device_count(), " CUDA device(s) present");
  }
  return device;
}

namespace {

constexpr const char* kDeviceListExpected = "a comma-separated list of cpu, cuda or cuda:N";

std::vector<torch::Device> parse_device_list(const std::string& text, bool check_machine) {
  std::vector<torch::Device> devices;
  for (const auto& item : split(text, ',')) {
    auto device = check_machine ? parse_one_device(item, "--devices", text, kDeviceListExpected)
                                : parse_device_name(item, "--devices", text, kDeviceListExpected);
    if (device.is_cuda() && !device.has_index()) device = torch::Device(torch::kCUDA, 0);
    devices.push_back(device);
  }
  TANDEM_CHECK_USAGE(!devices.empty(), "--devices: expected at least one device");
  return devices;
}

}  // namespace

std::vector<torch::Device> parse_device_names(const std::string& text) { return parse_device_list(text, false); }

std::vector<torch::Device> parse_devices(const std::string& text) { return parse_device_list(text, true); }

}  // namespace tandem::parallel
