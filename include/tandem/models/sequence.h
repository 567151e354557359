// tandem/models/sequence.h: an ordered, named, cloneable chain of modules.
//
// Every tandem model is a Sequence. It differs from torch::nn::Sequential in
// three ways that the parallel layer needs:
//  - it nests (Sequential cannot be stored in another Sequential);
//  - clone() keeps the children's names, so a replica's named_parameters()
//    match the original's (Sequential's clone renames them "0", "1", ...);
//  - its top-level children are the units a pipeline split cuts between.
#pragma once

#include <string>
#include <vector>

#include <torch/nn.h>

namespace tandem::models {

// A module whose forward multiplies by another module's parameter (a
// language model's head by its token embedding: Note [tied embedding] in
// models/gpt2.h). Sequence::tie binds it, and binds each copy's to the
// copy's own parameter.
class TiedWeightUser {
 public:
  virtual ~TiedWeightUser() = default;
  virtual void tie(torch::Tensor weight) = 0;
  // The bound parameter (undefined before tie(), or when not tied).
  virtual const torch::Tensor& tied() const = 0;
};

class SequenceImpl : public torch::nn::Cloneable<SequenceImpl> {
 public:
  SequenceImpl() = default;

  // Appends `module` under `name` (its index when empty). Any module with a
  // Tensor(Tensor) forward() fits, Sequence included.
  template <typename ModuleType>
  void push_back(std::string name, ModuleType module) {
    push_back_any(std::move(name), torch::nn::AnyModule(std::move(module)));
  }
  template <typename ModuleType>
  void push_back(ModuleType module) {
    push_back(std::string(), std::move(module));
  }
  void push_back_any(std::string name, torch::nn::AnyModule module);

  torch::Tensor forward(torch::Tensor x);

  // Whether child `index` writes its result into its input (an activation
  // built with inplace=true, such as torchvision's ResNet "relu"; a nested
  // Sequence whose first child does).
  bool writes_input(size_t index) const;

  // The tensor to hand to the run of children that starts at `first`: `x`
  // itself, or a copy of it where that child writes into its input and `x`
  // must stay as it is (Note [a stage that starts in place]). Forward does
  // this for its own first child; callers that run children one by one (a
  // pipeline stage's cost measurement) call it themselves.
  torch::Tensor input_for(size_t first, torch::Tensor x) const;

  // Activation checkpointing (Note [activation checkpointing] in
  // models/activation_checkpoint.h): the top-level children in runs of
  // `sizes` (summing to size(); plan_segments), every run but the last
  // recomputed in backward, in training with grad enabled. Empty: off.
  // clone() keeps it.
  void checkpoint_segments(std::vector<int64_t> sizes);
  const std::vector<int64_t>& checkpointed_segments() const { return segments_; }

  // Binds child `user` (a TiedWeightUser) to this Sequence's parameter
  // named `owner` ("embed.wte.weight"), now and in every clone(). Throws
  // tandem::Error when the child cannot be bound or there is no such
  // parameter.
  void tie(size_t user, const std::string& owner);
  struct Tie {
    size_t user;
    std::string owner;
  };
  const std::vector<Tie>& ties() const { return ties_; }

  size_t size() const { return modules_.size(); }
  const std::string& name(size_t index) const { return names_.at(index); }
  torch::nn::AnyModule& at(size_t index) { return modules_.at(index); }
  const torch::nn::AnyModule& at(size_t index) const { return modules_.at(index); }

  void reset() override {}
  std::shared_ptr<torch::nn::Module> clone(
      const std::optional<torch::Device>& device = std::nullopt) const override;
  void pretty_print(std::ostream& stream) const override;

 private:
  std::vector<std::string> names_;
  std::vector<torch::nn::AnyModule> modules_;
  std::vector<int64_t> segments_;
  std::vector<Tie> ties_;
};
TORCH_MODULE(Sequence);

}  // namespace tandem::models
