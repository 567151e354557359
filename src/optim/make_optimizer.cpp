// A run's optimizer, built in one place (make_optimizer.h).
#include "tandem/optim/make_optimizer.h"

#include "tandem/optim/adamw.h"
#include "tandem/optim/sgd.h"

namespace tandem::optim {

BuiltOptimizer make_optimizer(const OptimizerSettings& settings,
                              const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                              std::shared_ptr<dist::ProcessGroup> zero_group,
                              const std::vector<torch::Tensor>& elsewhere) {
  BuiltOptimizer built;
  if (settings.kind == OptimizerSettings::Kind::kAdamW) {
    // nanoGPT's groups: matrices and embeddings decayed, vectors not.
    auto groups = decay_groups(parameters, settings.adamw);
    if (zero_group) {
      auto sharded = std::make_unique<ZeroAdamW>(std::move(groups), settings.adamw, std::move(zero_group), elsewhere);
      built.sharded = sharded.get();
      built.optimizer = std::move(sharded);
    } else {
      built.optimizer = std::make_unique<AdamW>(std::move(groups), settings.adamw);
    }
    return built;
  }
  std::vector<torch::Tensor> tensors;
  for (const auto& p : parameters) tensors.push_back(p.value());
  if (zero_group) {
    auto sharded = std::make_unique<ZeroSgd>(std::move(tensors), settings.sgd, std::move(zero_group), elsewhere);
    built.sharded = sharded.get();
    built.optimizer = std::move(sharded);
  } else {
    built.optimizer = std::make_unique<Sgd>(std::move(tensors), settings.sgd);
  }
  return built;
}

}  // namespace tandem::optim
