// tandem train --mesh auto (auto_mesh.cpp): the layout the planner
// predicts fastest among those that fit and that the run's other flags
// allow, chosen once by the launching process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/cli/flags.h"
#include "tandem/engine/train_options.h"

namespace tandem::cli::internal {

// Set in the workers' environment: the chosen layout's prediction as JSON
// ({"mesh", "strategy", "rate", "unit": "tokens/s" or "images/s",
// "memory_bytes_per_rank", "bytes_per_step"}), printed by rank 0 beside
// the measured figures.
inline constexpr const char* kPlanned = "TANDEM_PLANNED_LAYOUT";

struct AutoLayout {
  std::vector<std::string> args;  // the command line with --mesh auto replaced by the layout's flags
  std::string prediction;         // kPlanned's JSON
  std::string summary;            // one line for the user
};

// Plans `o`'s job over `workers` ranks (tandem plan's model: a language
// model's shape, or an image classifier measured at the data's channels,
// classes and --image-size; the device `cpu` measured here, or h100 on
// CUDA) and returns the first layout, best first, that fits, that the
// flags the user gave allow (--strategy, --shard-optimizer,
// --sequence-parallel, --micro-batches) and that the run's checks accept.
// Throws tandem::UsageError naming --mesh auto when no layout fits.
AutoLayout choose_layout(const engine::TrainOptions& o, const FlagSet& flags, const std::vector<std::string>& args,
                         int64_t workers);

// After the run, on rank 0: the prediction beside what was measured (the
// last epoch's tokens/s, or images/s for an image classifier, and bytes a
// step), or "" when the run was not planned.
std::string planned_against_measured(double tokens_per_second, double images_per_second,
                                     const std::map<std::string, std::map<std::string, double>>& bytes);

}  // namespace tandem::cli::internal
