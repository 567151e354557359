// A registry image classifier measured for the planner (image_shape.h,
// Note [measured image models]).
#include "tandem/plan/image_shape.h"

#include <unistd.h>

#include <set>

#include <ATen/record_function.h>
#include <torch/csrc/profiler/util.h>
#include <torch/torch.h>

#include "one_thread.h"
#include "tandem/engine/counting_allocator.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::plan {
namespace {

// The products counted while forward_flops runs, on its thread.
thread_local double* counted_flops = nullptr;

std::unique_ptr<at::ObserverContext> count_product(const at::RecordFunction& fn) {
  static const std::set<std::string> products{"aten::conv2d", "aten::addmm", "aten::mm", "aten::bmm"};
  if (counted_flops != nullptr && products.count(fn.name()) > 0) {
    *counted_flops += double(torch::profiler::impl::computeFlops(fn.name(), torch::profiler::impl::saveExtraArgs(fn)));
  }
  return nullptr;
}

// The layers as FSDP sees them: a nested Sequence (not checkpointed) opened
// into its children (parallel/fsdp.cpp), each with its parameters.
void open_up(const models::SequenceImpl& sequence, const std::string& prefix, ImageShape& shape) {
  for (size_t i = 0; i < sequence.size(); ++i) {
    const auto& module = sequence.at(i);
    const std::string name = prefix + sequence.name(i);
    auto nested = std::dynamic_pointer_cast<models::SequenceImpl>(module.ptr());
    if (nested && nested->checkpointed_segments().empty()) {
      open_up(*nested, name + ".", shape);
      continue;
    }
    int64_t numel = 0;
    std::vector<std::vector<int64_t>> shapes;
    for (const auto& p : module.ptr()->parameters()) {
      numel += p.numel();
      shapes.push_back(p.sizes().vec());
    }
    shape.layer_names.push_back(name);
    shape.layer_numels.push_back(numel);
    shape.layer_shapes.push_back(std::move(shapes));
  }
}

struct Batch {
  torch::Tensor images, labels;
};

Batch batch_of(const ImageShape& s, int64_t n, torch::ScalarType dtype) {
  return {torch::randn({n, s.channels, s.image_size, s.image_size}, torch::TensorOptions().dtype(dtype)),
          torch::randint(0, s.classes, {n}, torch::kInt64)};
}

// A training step's forward, loss and backward.
void forward_backward(models::Sequence& net, const Batch& b) {
  torch::nn::functional::cross_entropy(net->forward(b.images), b.labels).backward();
}

// What a step holds at its peak beyond what was live before it, the
// gradients already there (zeroed, made by a step before): they count
// among the states, not here. Nothing made under the counting allocator
// outlives it (it owns what it allocated).
double step_peak(models::Sequence& net, const Batch& b) {
  for (auto& p : net->parameters()) p.mutable_grad().zero_();
  engine::CountingCpuAllocator counting;
  const int64_t before = counting->live();
  counting->reset_peak();
  forward_backward(net, b);
  return double(counting->peak() - before);
}

// While it lives, a CPU allocation larger than `limit` bytes is refused
// (c10::Error) instead of made: a model too large to build here (an mlp
// over 1024 x 1024 x 64 images asks 68 GB for one matrix) fails with a
// message, not the kernel's out-of-memory kill. It owns nothing: what it
// hands out is the allocator's before it, deleter and all.
class AllocationLimit final : public c10::Allocator {
 public:
  explicit AllocationLimit(size_t limit) : base_(c10::GetCPUAllocator()), limit_(limit) {
    c10::SetCPUAllocator(this, /*priority=*/100);
  }
  ~AllocationLimit() override { c10::SetCPUAllocator(base_, /*priority=*/100); }
  AllocationLimit(const AllocationLimit&) = delete;
  AllocationLimit& operator=(const AllocationLimit&) = delete;
  c10::DataPtr allocate(size_t n) override {
    TORCH_CHECK(n <= limit_, "a tensor of ", n, " bytes, more than the ", limit_,
                " the planner lets one take while it measures (a quarter of this machine's memory)");
    return base_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return base_->raw_deleter(); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }

 private:
  c10::Allocator* base_;
  size_t limit_;
};

// A quarter of this machine's memory: the largest tensor measuring a model may make.
int64_t measuring_limit() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * int64_t(page) / 4 : int64_t(4) << 30;
}


// One forward's products, as libtorch's profiler counts them (its FLOP
// formulas, from a callback on the operators' records: no profiler run).
double forward_flops(models::Sequence& net, const Batch& b) {
  double flops = 0;
  counted_flops = &flops;
  const auto handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback(count_product).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
  {
    torch::NoGradGuard no_grad;
    net->forward(b.images);
  }
  at::removeCallback(handle);
  counted_flops = nullptr;
  return flops;
}

void measure(const std::string& model, bool float64, ImageShape& s) {
  models::ModelOptions o;
  o.in_channels = s.channels;
  o.num_classes = s.classes;
  o.image_size = s.image_size;
  models::Sequence net = models::make_model(model, o);
  const auto dtype = float64 ? torch::kFloat64 : torch::kFloat32;
  net->to(dtype);
  net->train();
  open_up(*net, "", s);
  s.tensors = static_cast<int64_t>(net->parameters().size());
  for (const auto& b : net->buffers()) s.buffer_bytes += double(b.nbytes());
  // Two images at least: BatchNorm needs more than one value a channel.
  const auto small = batch_of(s, 2, dtype), large = batch_of(s, 4, dtype);
  forward_backward(net, small);  // the gradients made, and a first step's own allocations out of the way
  const double at_small = step_peak(net, small), at_large = step_peak(net, large);
  s.activation_bytes_per_sample = std::max(0.0, (at_large - at_small) / 2.0);
  s.activation_bytes_fixed = std::max(0.0, at_small - 2.0 * s.activation_bytes_per_sample);
  s.flops_per_sample = 3.0 * forward_flops(net, small) / 2.0;
}

}  // namespace

ImageShape measure_image_model(const std::string& model, int64_t channels, int64_t image_size, int64_t classes,
                               bool float64) {
  TANDEM_CHECK_USAGE(!models::is_language_model(model), "--model ", model,
                     ": a language model, not an image classifier");
  TANDEM_CHECK_USAGE(channels >= 1 && channels <= 64, "--channels ", channels, ": expected 1 to 64");
  TANDEM_CHECK_USAGE(image_size >= 1 && image_size <= 1024, "--image-size ", image_size, ": expected 1 to 1024 pixels");
  TANDEM_CHECK_USAGE(classes >= 2 && classes <= 100000, "--classes ", classes, ": expected 2 to 100000");
  TANDEM_CHECK(engine::CountingAllocator::installed() == nullptr,
               "the planner measures an image model with its own counting allocator; one is installed already");
  internal::OneThread one;
  ImageShape s;
  s.channels = channels;
  s.image_size = image_size;
  s.classes = classes;
  try {
    AllocationLimit limit(static_cast<size_t>(measuring_limit()));
    measure(model, float64, s);
  } catch (const std::exception& e) {
    std::string why = e.what();
    why = why.substr(0, why.find('\n'));
    throw UsageError("--model " + model + " for images of " + std::to_string(channels) + " x " +
                     std::to_string(image_size) + " x " + std::to_string(image_size) +
                     " (--channels, --image-size): the planner builds and runs it to measure it, and it failed: " +
                     why);
  }
  return s;
}

}  // namespace tandem::plan
