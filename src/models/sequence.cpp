#include "tandem/models/sequence.h"

namespace tandem::models {

void SequenceImpl::push_back_any(std::string name, torch::nn::AnyModule module) {
  if (name.empty()) name = std::to_string(modules_.size());
  register_module(name, module.ptr());
  names_.push_back(std::move(name));
  modules_.push_back(std::move(module));
}

torch::Tensor SequenceImpl::forward(torch::Tensor x) {
  for (auto& module : modules_) x = module.forward(std::move(x));
  return x;
}

std::shared_ptr<torch::nn::Module> SequenceImpl::clone(
    const std::optional<torch::Device>& device) const {
  auto copy = std::make_shared<SequenceImpl>();
  for (size_t i = 0; i < modules_.size(); ++i) {
    copy->push_back_any(names_[i], modules_[i].clone(device));
  }
  copy->train(is_training());
  return copy;
}

void SequenceImpl::pretty_print(std::ostream& stream) const { stream << "tandem::Sequence"; }

}  // namespace tandem::models
