// src/cli/weights_defaults.h: tandem eval's settings from the weights'
// metadata (Note [eval from the weights] in weights_defaults.cpp).
#pragma once

#include <map>
#include <string>

#include "tandem/cli/flags.h"
#include "tandem/engine/train_options.h"

namespace tandem::cli {

// Checks the flags given, alone, before any file is read: a usage mistake
// is exit 2 whatever the weights say. A flag that only some models take
// (--stem, --width-mult) is checked against the --model given, or one that
// takes it when the model is left to the metadata.
void check_given_flags(const engine::TrainOptions& options, const FlagSet& flags);

struct FromWeights {
  bool augment_or_size_given = false;  // the evaluation transform is the user's, not the run's
};

// Fills every setting the flags left out from `metadata` (of the file at
// `path`), warning where a flag given differs from it. A value in the
// metadata that tandem cannot use is the file's fault: tandem::Error naming
// the file (exit 1), not a usage error.
FromWeights defaults_from_weights(const std::map<std::string, std::string>& metadata, const std::string& path,
                                  const FlagSet& flags, engine::TrainOptions& options);

}  // namespace tandem::cli
