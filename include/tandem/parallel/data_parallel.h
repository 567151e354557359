// tandem/parallel/data_parallel.h: single-process data parallelism
// (PyTorch's nn.DataParallel), seeds 000 and 003.
//
//   auto dp = parallel::DataParallel(model, {{torch::kCUDA, 0}, {torch::kCUDA, 1}});
//   auto out = dp->forward(batch);        // scatter, replicate, parallel_apply, gather
//   loss_fn(out).backward();              // gradients summed into model's parameters
//
// The four primitives, each differentiable:
//   scatter         split a batch along dim 0 over devices, sizes as even as
//                   possible (the first n mod k pieces one larger); a batch
//                   smaller than the device list uses only its first devices
//   replicate       copies of a module on the devices whose gradients flow
//                   back and sum into the original's parameters
//   parallel_apply  one thread per replica, each on the caller's current
//                   stream of its device; the first exception is rethrown
//                   naming its device
//   gather          concatenate the outputs on the output device
//
// Note [kept replicas]: the libtorch frontend's data_parallel deep-clones the
// module on every call (pytorch/pytorch#40581 reports it slower than one
// GPU). A ReplicaSet clones once per device; each forward only copies the
// original's parameter and buffer values into the replicas (in place, no
// autograd), and a hook on each replica parameter's gradient accumulator
// adds its gradient into the original parameter's gradient (under a lock
// per parameter, as backward may run on several device threads) as soon as
// backward produces it, then clears the replica's. After backward the
// original holds the sum over replicas: the gradient of the whole batch, as
// on one device. The original module never runs forward itself, so it may
// live on any device (gradients are moved to it).
//
// Buffers follow PyTorch's DataParallel: every forward copies the original's
// buffers into the replicas and, after it, copies the first replica's back,
// so BatchNorm's running statistics are updated from the first device's
// share of the batch alone. In training, each replica's BatchNorm
// normalises over its own share. Devices may repeat (cpu,cpu or
// cuda:0,cuda:0): replicas are then separate copies on one device, which is
// how CI tests this without GPUs.
//
// Note [kept threads]: replica 0 runs on the caller's thread, and a
// ReplicaSet keeps one thread per further replica for its lifetime
// (parallel_apply, for one-off use, starts new ones). A new thread per
// forward starts with cold thread-local state, and cuDNN's execution plans
// are cached per thread (ATen's Conv_v8.cpp): every convolution of a new
// thread's forward built its plan again. On an H200, a resnet18 step over
// cuda:0,cuda:0 took 2.9 times the model alone's with a new thread per
// forward, 1.3 times with kept threads (bench/results/dp.md).
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/types.h>

namespace tandem::parallel {

namespace detail {
class TaskThread;  // src/parallel/task_thread.h
}

// The sizes scatter() splits n rows into over k devices.
std::vector<int64_t> scatter_sizes(int64_t n, size_t k);

std::vector<torch::Tensor> scatter(const torch::Tensor& input,
                                   const std::vector<torch::Device>& devices);

torch::Tensor gather(const std::vector<torch::Tensor>& outputs, const torch::Device& device);

// replicas[i]->forward(inputs[i]) for every i, replica i on devices[i], one
// new thread each but the first (grad mode, autocast and the rest of ATen's
// thread-local state follow the caller, and so does its current stream on
// each device).
std::vector<torch::Tensor> parallel_apply(std::vector<torch::nn::AnyModule>& replicas,
                                          const std::vector<torch::Tensor>& inputs,
                                          const std::vector<torch::Device>& devices);

// Note [kept replicas].
class ReplicaSet {
 public:
  ReplicaSet(torch::nn::AnyModule module, std::vector<torch::Device> devices);
  ~ReplicaSet();
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  // Copies the original's parameters, buffers and train/eval mode into the
  // first `count` replicas; returns the replicas.
  std::vector<torch::nn::AnyModule>& refresh(size_t count);
  // After a forward: the first replica's buffers into the original.
  void keep_buffers();
  // One forward of the first inputs.size() replicas: refresh, then
  // parallel_apply with replica i > 0 on the thread kept for it (Note [kept
  // threads]), then keep_buffers. One at a time: a call while another runs
  // (from another thread) is an error.
  std::vector<torch::Tensor> forward(const std::vector<torch::Tensor>& inputs);
  const std::vector<torch::Device>& devices() const { return devices_; }

 private:
  struct Shared;
  torch::nn::AnyModule module_;
  std::vector<torch::Device> devices_;
  std::vector<torch::nn::AnyModule> replicas_;
  std::shared_ptr<Shared> shared_;  // outlives this set while graphs need it
  std::vector<std::unique_ptr<detail::TaskThread>> threads_;  // replicas 1..
  std::mutex running_;  // forward()
};

struct DataParallelOptions {
  std::vector<torch::Device> devices;       // empty: every CUDA device, else {cpu}
  std::optional<torch::Device> output_device;  // empty: devices[0]
  bool trace = false;  // print each replica's input and output shapes and device
};

class DataParallelImpl : public torch::nn::Module {
 public:
  DataParallelImpl(torch::nn::AnyModule module, DataParallelOptions options);
  template <typename M>
  DataParallelImpl(M module, DataParallelOptions options)
      : DataParallelImpl(torch::nn::AnyModule(std::move(module)), std::move(options)) {}

  torch::Tensor forward(const torch::Tensor& input);
  const std::vector<torch::Device>& devices() const { return replicas_->devices(); }

 private:
  torch::nn::AnyModule module_;
  DataParallelOptions options_;
  std::unique_ptr<ReplicaSet> replicas_;
};
TORCH_MODULE(DataParallel);

// The functional form, for one-off use: it replicates on every call (a
// DataParallel module keeps its replicas).
torch::Tensor data_parallel(torch::nn::AnyModule module, const torch::Tensor& input,
                            const std::vector<torch::Device>& devices,
                            std::optional<torch::Device> output_device = std::nullopt);

// "cpu,cpu" or "cuda:0,cuda:1" -> devices ("cuda" is cuda:0); a clear error
// naming --devices: tandem::UsageError for text that names no devices
// (exit 2), tandem::Error for CUDA devices this machine lacks (exit 1).
std::vector<torch::Device> parse_devices(const std::string& text);

// parse_devices' first half, what the text alone shows: the UsageError,
// and no look at the machine (train's checks before any worker starts).
std::vector<torch::Device> parse_device_names(const std::string& text);

// One device of a device flag (engine::parse_device's --device, and each
// item of --devices): cpu, cuda or cuda:N, with CUDA present and N in range.
// Errors name `flag` and quote `whole` (the flag's text), and say that
// `expected` was expected; as parse_devices, a UsageError for the text and
// an Error for the machine. parse_device_name checks the text only.
torch::Device parse_one_device(const std::string& item, const std::string& flag,
                               const std::string& whole, const std::string& expected);
torch::Device parse_device_name(const std::string& item, const std::string& flag,
                                const std::string& whole, const std::string& expected);

}  // namespace tandem::parallel
