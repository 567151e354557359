#include "tandem/models/activation_checkpoint.h"

#include <optional>
#include <utility>

#include <ATen/autocast_mode.h>
#include <ATen/core/ivalue.h>
#include <torch/autograd.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::models {

namespace {

// What the recomputation needs, kept in the autograd context.
struct Segment : torch::CustomClassHolder {
  SegmentFn fn;
  std::vector<torch::Tensor> buffers;
  bool cpu_autocast = false, cuda_autocast = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
  at::Generator cpu_generator;              // a copy of the state at the forward
  std::optional<at::Generator> cuda_generator;  // the input's CUDA device's, likewise
  std::optional<c10::Device> cuda_device;
};

// Sets autocast for one device type and puts it back.
class AutocastAs {
 public:
  AutocastAs(c10::DeviceType type, bool enabled, at::ScalarType dtype)
      : type_(type), was_enabled_(at::autocast::is_autocast_enabled(type)),
        was_dtype_(at::autocast::get_autocast_dtype(type)) {
    at::autocast::set_autocast_enabled(type_, enabled);
    at::autocast::set_autocast_dtype(type_, dtype);
    if (enabled) at::autocast::increment_nesting();
    enabled_ = enabled;
  }
  ~AutocastAs() {
    if (enabled_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(type_, was_enabled_);
    at::autocast::set_autocast_dtype(type_, was_dtype_);
  }

 private:
  c10::DeviceType type_;
  bool was_enabled_, enabled_ = false;
  at::ScalarType was_dtype_;
};

// Sets a generator's state for a scope and puts the current one back.
class GeneratorAs {
 public:
  GeneratorAs(at::Generator live, const at::Generator& saved) : live_(std::move(live)) {
    std::lock_guard<std::mutex> lock(live_.mutex());
    now_ = live_.clone();
    live_.set_state(saved.get_state());
  }
  ~GeneratorAs() {
    std::lock_guard<std::mutex> lock(live_.mutex());
    live_.set_state(now_.get_state());
  }

 private:
  at::Generator live_, now_;
};

at::Generator snapshot(at::Generator live) {
  std::lock_guard<std::mutex> lock(live.mutex());
  return live.clone();
}

struct Recompute : torch::autograd::Function<Recompute> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, c10::intrusive_ptr<Segment> segment,
                               const torch::Tensor& input, const torch::Tensor& /*anchor*/) {
    segment->cpu_autocast = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
    segment->cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
    segment->cuda_autocast = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
    segment->cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
    segment->cpu_generator = snapshot(at::globalContext().defaultGenerator(c10::DeviceType::CPU));
    if (input.is_cuda()) {
      segment->cuda_device = input.device();
      segment->cuda_generator = snapshot(at::globalContext().defaultGenerator(input.device()));
    }
    ctx->save_for_backward({input});
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    return segment->fn(input);  // Function::apply runs it with grad mode off: no graph, no activations
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const auto saved = ctx->get_saved_variables().at(0);
    auto input = saved.detach().requires_grad_(saved.requires_grad());
    // The buffers as they are now (after the forward), put back afterwards.
    std::vector<torch::Tensor> kept;
    {
      torch::NoGradGuard no_grad;
      for (const auto& b : segment->buffers) kept.push_back(b.clone());
    }
    torch::Tensor output;
    {
      torch::AutoGradMode grad(true);
      AutocastAs cpu(c10::DeviceType::CPU, segment->cpu_autocast, segment->cpu_dtype);
      AutocastAs cuda(c10::DeviceType::CUDA, segment->cuda_autocast, segment->cuda_dtype);
      GeneratorAs cpu_rng(at::globalContext().defaultGenerator(c10::DeviceType::CPU), segment->cpu_generator);
      std::optional<GeneratorAs> cuda_rng;
      if (segment->cuda_device) {
        cuda_rng.emplace(at::globalContext().defaultGenerator(*segment->cuda_device), *segment->cuda_generator);
      }
      output = segment->fn(input);
    }
    TANDEM_CHECK(output.requires_grad(), "checkpoint_activations: the recomputed segment's output does "
                 "not require grad (a segment without parameters fed an input that needs none?)");
    torch::autograd::backward({output}, {grad_outputs.at(0)});
    {
      // After the backward: BatchNorm's backward reads the running
      // statistics it saved, and a write before it would be refused.
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < kept.size(); ++i) segment->buffers[i].copy_(kept[i]);
    }
    // One per input of forward: the segment (not a tensor), the input, the anchor.
    return {torch::Tensor(), input.requires_grad() ? input.grad() : torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor checkpoint_activations(SegmentFn fn, const torch::Tensor& input, std::vector<torch::Tensor> buffers) {
  if (!torch::GradMode::is_enabled()) return fn(input);
  auto segment = c10::make_intrusive<Segment>();
  segment->fn = std::move(fn);
  segment->buffers = std::move(buffers);
  // Note [activation checkpointing]: the anchor makes the output need grad.
  // A floating one: a language model's first segment is fed token ids.
  const auto dtype = input.is_floating_point() ? input.scalar_type() : torch::kFloat32;
  auto anchor = torch::empty({0}, input.options().dtype(dtype).requires_grad(true));
  return Recompute::apply(segment, input, anchor);
}

std::vector<int64_t> plan_segments(int64_t children, int64_t segments) {
  TANDEM_CHECK(segments >= 1 && segments <= children, "activation checkpointing: expected 1 to ",
               children, " segments (the model's top-level layers), got ", segments);
  std::vector<int64_t> sizes(static_cast<size_t>(segments), children / segments);
  for (int64_t i = 0; i < children % segments; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

}  // namespace tandem::models
