#include "tandem/models/sequence.h"

#include "tandem/models/activation_checkpoint.h"
#include "tandem/util/check.h"

namespace tandem::models {

void SequenceImpl::push_back_any(std::string name, torch::nn::AnyModule module) {
  if (name.empty()) name = std::to_string(modules_.size());
  register_module(name, module.ptr());
  names_.push_back(std::move(name));
  modules_.push_back(std::move(module));
}

torch::Tensor SequenceImpl::forward(torch::Tensor x) {
  if (segments_.empty() || !is_training() || !torch::GradMode::is_enabled()) {
    for (auto& module : modules_) x = module.forward(std::move(x));
    return x;
  }
  size_t begin = 0;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const size_t end = begin + static_cast<size_t>(segments_[s]);
    auto run = [this, begin, end](const torch::Tensor& input) {
      torch::Tensor y = input;
      for (size_t i = begin; i < end; ++i) y = modules_[i].forward(std::move(y));
      return y;
    };
    if (s + 1 == segments_.size()) {
      x = run(x);  // the last one's activations are needed at once: kept
    } else {
      std::vector<torch::Tensor> buffers;
      for (size_t i = begin; i < end; ++i) {
        for (auto& b : modules_[i].ptr()->buffers()) buffers.push_back(b);
      }
      x = checkpoint_activations(run, x, std::move(buffers));
    }
    begin = end;
  }
  return x;
}

void SequenceImpl::checkpoint_segments(std::vector<int64_t> sizes) {
  int64_t total = 0;
  for (auto n : sizes) {
    TANDEM_CHECK(n > 0, "Sequence::checkpoint_segments: a segment of ", n, " layers");
    total += n;
  }
  TANDEM_CHECK(sizes.empty() || total == static_cast<int64_t>(modules_.size()),
               "Sequence::checkpoint_segments: segments of ", total, " layers for a sequence of ",
               modules_.size());
  segments_ = std::move(sizes);
}

std::shared_ptr<torch::nn::Module> SequenceImpl::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = std::make_shared<SequenceImpl>();
  for (size_t i = 0; i < modules_.size(); ++i) {
    copy->push_back_any(names_[i], modules_[i].clone(device));
  }
  copy->train(is_training());
  copy->segments_ = segments_;
  return copy;
}

void SequenceImpl::pretty_print(std::ostream& stream) const { stream << "tandem::Sequence"; }

}  // namespace tandem::models
