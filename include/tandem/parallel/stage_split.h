// tandem/parallel/stage_split.h: cutting a model into pipeline stages.
//
// A models::Sequence's top-level children are the units a split cuts
// between: a split is the number of children in each stage, in order, every
// stage at least one. Three ways to choose it (seed 001 cuts ResNet-50 by
// hand; torchgpipe balances by parameters or by time):
//
//   split_at_names   explicit: the names of the children that begin stages
//                    2, 3, ... ("conv2,fc1" cuts convnet in three)
//   balance_stages   contiguous stages minimising the largest stage's cost,
//                    for costs per child from either of
//     parameter_costs  the number of parameters (cheap, deterministic)
//     measured_costs   forward + backward seconds on a sample batch,
//                      measured on a copy of the model (the model's
//                      parameters, gradients and statistics are untouched)
//
// split_sequence() then makes the stage modules; they share the children
// (and so the parameters) with the model they were cut from.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/types.h>

#include "tandem/models/sequence.h"

namespace tandem::parallel {

// Children per stage. Throws tandem::Error for an unknown name, names out of
// order, or a count of names that does not give `stages` stages.
std::vector<int64_t> split_at_names(const models::Sequence& model, const std::string& names,
                                    int64_t stages);

// The contiguous split of costs.size() children into `stages` non-empty
// stages whose largest total cost is smallest; among those, the one whose
// earlier stages are heaviest (so the result is deterministic). Throws
// tandem::Error when there are fewer children than stages or a cost is
// negative.
std::vector<int64_t> balance_stages(const std::vector<double>& costs, int64_t stages);

// For the interleaved schedule: `stages` * `chunks` contiguous pieces,
// piece k on stage k % stages, whose largest per-stage total cost is
// smallest (what sets the pace once the pipeline is full), and among those
// the one whose largest piece is smallest (what sets the fill and drain).
// A branch and bound from balance_stages' split, which stops after
// `budget` search nodes with the best split found by then (models of a
// few dozen layers are searched to the end well within the default).
// chunks == 1 is balance_stages. Throws as balance_stages does.
std::vector<int64_t> balance_interleaved(const std::vector<double>& costs, int64_t stages,
                                         int64_t chunks, int64_t budget = 2'000'000);

std::vector<double> parameter_costs(const models::Sequence& model);

// How many timed passes measured_costs makes: at least min_repeats, then
// more while the passes so far took less than budget_seconds, up to
// max_repeats. A cheap model thus gets many passes (a layer's least time
// over twenty is far less likely to have been hit by other work on a
// loaded machine than its least over three) and a costly one few.
struct MeasureOptions {
  int64_t min_repeats = 3;
  int64_t max_repeats = 20;
  double budget_seconds = 1.0;
};

// The least over the timed passes of each child's forward plus backward
// time on `sample` (in seconds), measured on a clone of `model` on sample's
// device, after one untimed pass. As in training, the backward computes a
// gradient for a child's input only when a child before it has trainable
// parameters (none for the data). Throws tandem::Error unless 1 <=
// min_repeats <= max_repeats and budget_seconds >= 0.
std::vector<double> measured_costs(const models::Sequence& model, const torch::Tensor& sample,
                                   const MeasureOptions& options = {});

// The stages' modules: stage s holds the next sizes[s] children of `model`
// under their own names (shared, not copied). Throws unless the sizes are
// positive and add up to model->size().
std::vector<models::Sequence> split_sequence(const models::Sequence& model,
                                             const std::vector<int64_t>& sizes);

// "conv1..pool1 | conv2..fc2" for logs.
std::string describe_split(const models::Sequence& model, const std::vector<int64_t>& sizes);

}  // namespace tandem::parallel
