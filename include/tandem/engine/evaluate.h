// tandem/engine/evaluate.h: a model's loss and accuracy on a data set,
// split over a group's ranks (the Trainer after every epoch; tandem eval).
#pragma once

#include <cstdint>
#include <functional>

#include <torch/torch.h>

#include "tandem/data/dataset.h"
#include "tandem/dist/process_group.h"
#include "tandem/engine/task.h"
#include "tandem/models/sequence.h"

namespace tandem::engine {

struct EvalResult {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t count = 0;
};

// Mean loss and accuracy of `model` over `dataset` by `task` (eval mode, no
// grad; null: classification), with `workers` loader threads, `batch_size`
// samples a forward (a language model's short windows: at least 2,048
// tokens a forward; Note [evaluation batches of tokens]). With a group, each rank evaluates the
// samples r, r + W, ... and the sums are all-reduced: every rank returns the
// result over the whole data set. `forward`, when given, runs the model
// instead of model->forward (e.g. a pipeline's stages on their devices);
// every rank then calls it equally often, on empty batches once its own
// samples are done, so a forward with collectives in it (FSDP's) keeps the
// ranks in step. A `forward` that returns an undefined tensor has its output
// on another rank (a pipeline stage before the last): that batch counts
// nothing here.
// Under context parallelism (`cut`) the group's ranks come in runs of
// `copies` consecutive ones that read the same samples, each scoring its
// `part` of their sequences (inputs and targets).
using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
struct SequenceCut {
  int64_t copies = 1;
  std::function<torch::Tensor(const torch::Tensor&)> part;
};
EvalResult evaluate(models::Sequence& model, const data::Dataset& dataset, int64_t batch_size,
                    const torch::Device& device, int64_t workers = 0,
                    dist::ProcessGroup* group = nullptr, const Forward& forward = {},
                    const Task* task = nullptr, const SequenceCut& cut = {});

}  // namespace tandem::engine
