// A run's optimizer, built in one place (make_optimizer.h).
#include "tandem/optim/make_optimizer.h"

#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"

namespace tandem::optim {

namespace {

// `Plain` over `params`, or `Sharded` (its ZeRO-1 form) over them when a
// group is given.
template <class Plain, class Sharded, class Params, class Options>
BuiltOptimizer plain_or_sharded(Params params, const Options& options, std::shared_ptr<dist::ProcessGroup> group,
                                const std::vector<torch::Tensor>& elsewhere, const std::vector<torch::Tensor>& own) {
  BuiltOptimizer built;
  if (!group) {
    built.optimizer = std::make_unique<Plain>(std::move(params), options);
    return built;
  }
  auto sharded = std::make_unique<Sharded>(std::move(params), options, std::move(group), elsewhere, own);
  built.sharded = sharded.get();
  built.optimizer = std::move(sharded);
  return built;
}

}  // namespace

BuiltOptimizer make_optimizer(const OptimizerSettings& settings,
                              const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                              std::shared_ptr<dist::ProcessGroup> zero_group,
                              const std::vector<torch::Tensor>& elsewhere, const std::vector<torch::Tensor>& own) {
  if (settings.kind == OptimizerSettings::Kind::kAdamW) {
    // nanoGPT's groups: matrices and embeddings decayed, vectors not.
    return plain_or_sharded<AdamW, ZeroAdamW>(decay_groups(parameters, settings.adamw), settings.adamw,
                                              std::move(zero_group), elsewhere, own);
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& p : parameters) tensors.push_back(p.value());
  return plain_or_sharded<Sgd, ZeroSgd>(std::move(tensors), settings.sgd, std::move(zero_group), elsewhere, own);
}

}  // namespace tandem::optim
