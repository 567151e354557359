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

// Note [a stage that starts in place]: torchvision's ResNet has a top-level
// ReLU(inplace=true) after bn1. Inside one model it writes over bn1's output,
// which autograd allows. But where a run of children starts at it, its input
// is a tensor that must not change: a pipeline stage's received activation
// (a leaf that requires grad, which autograd refuses to modify: "a leaf
// Variable that requires grad is being used in an in-place operation"), the
// input a cost measurement made a leaf, or a checkpointed segment's input,
// saved for the recomputation while the forward runs without grad (it would
// be recomputed from the ReLU's output, or refused as modified). So such a
// run starts from a copy: one activation's copy at that boundary only.
bool SequenceImpl::writes_input(size_t index) const {
  const auto& module = modules_.at(index);
  auto* p = module.ptr().get();
  if (auto* nested = dynamic_cast<const SequenceImpl*>(p)) return nested->size() > 0 && nested->writes_input(0);
  namespace nn = torch::nn;
  if (auto* m = dynamic_cast<nn::ReLUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::ReLU6Impl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::LeakyReLUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::ELUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::SELUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::CELUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::HardtanhImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::RReLUImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::ThresholdImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::DropoutImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::Dropout2dImpl*>(p)) return m->options.inplace();
  if (auto* m = dynamic_cast<nn::Dropout3dImpl*>(p)) return m->options.inplace();
  return false;
}

torch::Tensor SequenceImpl::input_for(size_t first, torch::Tensor x) const {
  const bool kept = x.requires_grad() && (x.is_leaf() || !torch::GradMode::is_enabled());
  if (kept && first < modules_.size() && writes_input(first)) return x.clone();
  return x;
}

torch::Tensor SequenceImpl::forward(torch::Tensor x) {
  if (segments_.empty() || !is_training() || !torch::GradMode::is_enabled()) {
    x = input_for(0, std::move(x));
    for (auto& module : modules_) x = module.forward(std::move(x));
    return x;
  }
  size_t begin = 0;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const size_t end = begin + static_cast<size_t>(segments_[s]);
    auto run = [this, begin, end](const torch::Tensor& input) {
      torch::Tensor y = input_for(begin, input);
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
  for (const auto& t : ties_) copy->tie(t.user, t.owner);  // the copy's head, the copy's embedding
  return copy;
}

void SequenceImpl::tie(size_t user, const std::string& owner) {
  TANDEM_CHECK(user < modules_.size(), "Sequence::tie: no child ", user);
  auto* bound = dynamic_cast<TiedWeightUser*>(modules_[user].ptr().get());
  TANDEM_CHECK(bound != nullptr, "Sequence::tie: child ", names_[user], " takes no tied weight");
  const auto parameters = named_parameters();  // find() points into it: kept alive
  const auto* weight = parameters.find(owner);
  TANDEM_CHECK(weight != nullptr, "Sequence::tie: no parameter ", owner);
  bound->tie(*weight);
  for (const auto& t : ties_) {
    if (t.user == user) return;
  }
  ties_.push_back({user, owner});
}

void SequenceImpl::pretty_print(std::ostream& stream) const { stream << "tandem::Sequence"; }

}  // namespace tandem::models
