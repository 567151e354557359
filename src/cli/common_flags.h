// The flags `tandem train` and `tandem eval` share: the data and the model.
// Internal to the cli layer.
#pragma once

#include "tandem/cli/flags.h"
#include "tandem/engine/train_options.h"

namespace tandem::cli {

// Section "data": --data, --val-data, --workers, --augment, --image-size,
// --skip-bad-images.
void add_data_flags(FlagSet& flags, engine::TrainOptions& o);

// Section "model": --model, --width-mult, --stem, --dtype, --channels-last,
// --cudnn-benchmark, --amp.
void add_model_flags(FlagSet& flags, engine::TrainOptions& o);

}  // namespace tandem::cli
