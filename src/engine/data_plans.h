// The data plans' constructors, for make_data_plan (engine/data_plan.h).
#pragma once

#include <memory>

#include "tandem/engine/data_plan.h"

namespace tandem::engine::internal {

// The module the dp dimension replicates: the model, or this rank's
// pipeline pieces under a mesh (Note [replicated stages]).
std::shared_ptr<torch::nn::Module> replica_of(const DataPlanSetup& setup);

std::unique_ptr<DataPlan> make_ddp_plan(const DataPlanSetup& setup);
std::unique_ptr<DataPlan> make_fsdp_plan(const DataPlanSetup& setup);

}  // namespace tandem::engine::internal
