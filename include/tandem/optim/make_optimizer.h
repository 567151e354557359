// tandem/optim/make_optimizer.h: a run's optimizer, built in one place.
//
//   optim::OptimizerSettings s = optim::OptimizerSettings::adamw(options);
//   auto built = optim::make_optimizer(s, model->named_parameters(), zero_group);
//
// SGD (optim/sgd.h) or AdamW in nanoGPT's decay groups (optim/adamw.h),
// plain or, given a group, with its state sharded over it (ZeRO-1:
// ZeroRedundancy<Sgd or AdamW>, optim/zero.h). A data plan that steps
// something else (FSDP's shards) builds its own from the same settings.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tandem/dist/process_group.h"
#include "tandem/optim/zero.h"

namespace tandem::optim {

struct OptimizerSettings {
  enum class Kind { kSgd, kAdamW };
  Kind kind = Kind::kSgd;
  torch::optim::SGDOptions sgd{0.0};
  torch::optim::AdamWOptions adamw{0.0};

  static OptimizerSettings of(const torch::optim::SGDOptions& options) {
    OptimizerSettings s;
    s.kind = Kind::kSgd;
    s.sgd = options;
    return s;
  }
  static OptimizerSettings of(const torch::optim::AdamWOptions& options) {
    OptimizerSettings s;
    s.kind = Kind::kAdamW;
    s.adamw = options;
    return s;
  }
};

struct BuiltOptimizer {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  ShardedState* sharded = nullptr;  // the optimizer, when ZeRO-1 shards its state
};

// The optimizer of `settings` over `parameters` (AdamW's decay groups are
// chosen by name and shape). `zero_group`: shard the state over it
// (ZeRO-1), or null for the plain optimizer. `elsewhere`: parameters other
// ranks step (a pipeline's other stages), and `own`: parameters each rank
// steps its own of (the experts under ep), as ZeroRedundancy takes them.
BuiltOptimizer make_optimizer(const OptimizerSettings& settings,
                              const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                              std::shared_ptr<dist::ProcessGroup> zero_group = nullptr,
                              const std::vector<torch::Tensor>& elsewhere = {},
                              const std::vector<torch::Tensor>& own = {});

}  // namespace tandem::optim
