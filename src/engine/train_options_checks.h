// The parts of check_train_options (train_options.h) kept in files of
// their own (src/engine/train_options*.cpp only).
#pragma once

#include "tandem/engine/train_options.h"

namespace tandem::engine::internal {

// A language model on token data, an image model on images, and each
// kind's own flags with it alone; --seq-len within the model's context.
void check_model_and_data(const TrainOptions& o);

// The optimizer's own flags (--nesterov, --beta1, ...) with it alone, and
// AdamW kept from --cuda-graph, which captures SGD's step only.
void check_optimizer(const TrainOptions& o);

}  // namespace tandem::engine::internal
