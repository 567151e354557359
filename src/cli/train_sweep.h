// What tandem train's files share (train_command.cpp, train_sweep.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tandem/cli/flags.h"
#include "tandem/engine/train_options.h"

namespace tandem::cli::internal {

// Set in the environment of the workers `tandem train --nproc-per-node`
// starts itself: they run the same command line, --nproc-per-node included.
inline constexpr const char* kSelfLaunched = "TANDEM_TRAIN_SELF_LAUNCHED";

// What the flags alone do not say: the pairs of flags that exclude each
// other refused (UsageError), AdamW's defaults applied.
void complete_train_options(engine::TrainOptions& o, const FlagSet& flags);

// AdamW's own --lr and --weight-decay where the command line gives none
// (the flag table's defaults are SGD's): kAdamWLr, kAdamWWeightDecay.
void apply_optimizer_defaults(engine::TrainOptions& o, const FlagSet& flags);
// Refuses a flag given for a feature the run does not have (a pipeline's,
// FSDP's), even at its default value, naming it.
void check_flags_that_apply(const engine::TrainOptions& o, const FlagSet& flags);

// This program's path, for re-running it as workers.
std::string self_executable();

// Note [worker footprint]: `workers` CPU workers measured against the
// machine before they start (not with --skip-resource-check). Throws
// tandem::Error with the figures when the memory cannot hold them.
void check_resources(const engine::TrainOptions& o, int64_t workers);

// The short form of `tandem launch --nproc-per-node N -- tandem train ...`
// (train_launch.cpp): the workers run the command line `args` with `env`
// added; returns the job's exit code.
int launch_workers(const engine::TrainOptions& options, const std::vector<std::string>& args, int64_t nproc,
                   const std::vector<std::pair<std::string, std::string>>& env);

// --nproc-per-node 1,2,4: the process counts of a scaling sweep; nullopt
// for one count (N or auto). Throws UsageError for a bad list.
std::optional<std::vector<int64_t>> sweep_counts(const std::string& text);

// The job launched once per count, one after the other, and the scaling
// table of their epochs; returns the exit code.
int train_sweep(const std::vector<int64_t>& counts, const std::vector<std::string>& args,
                const engine::TrainOptions& o, const FlagSet& flags);

}  // namespace tandem::cli::internal
