// What one Trainer::run() holds from its set-up to its end, and what one
// epoch counts (src/engine/trainer*.cpp only).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "tandem/data/loader.h"
#include "tandem/engine/divergence.h"
#include "tandem/engine/run_record.h"
#include "tandem/engine/step_traffic.h"
#include "tandem/engine/trainer.h"
#include "tandem/optim/schedule.h"
#include "tandem/optim/sgd.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/progress.h"
#include "tandem/util/stopwatch.h"

namespace tandem::engine {

struct Trainer::RunState {
  Stopwatch clock;
  TrainResult result;
  std::unique_ptr<data::DataLoader> loader;
  int64_t steps_per_epoch = 0;
  std::unique_ptr<torch::optim::Optimizer> optimizer;  // optim::Sgd or optim::AdamW (--optimizer)
  optim::ShardedState* zero = nullptr;    // --shard-optimizer: the optimizer, sharded
  parallel::FsdpState* fsdp_state = nullptr;  // FSDP: the optimizer, over the shards
  std::unique_ptr<optim::CosineSchedule> schedule;
  std::string export_path;  // --export-weights, "{rank}" resolved
  Resumption start;         // the checkpoints, and the position the run goes on from
  std::unique_ptr<RunRecorder> record;
  DivergenceFacts divergence;  // Note [diverged]
  std::unique_ptr<StepTraffic> traffic;  // what the steps send over each dimension
  std::unique_ptr<CudaGraphStep> graphed;  // --cuda-graph
  bool stop = false;  // --max-steps reached
  checkpoint::TrainPosition& position() { return start.position; }
};

struct Trainer::EpochState {
  std::optional<Progress> progress;
  Stopwatch clock;
  int64_t images = 0;  // trained on in this run, over all ranks
  StepCounters counters;
  double lr = 0.0;
  torch::Tensor loss_sum, correct;  // on the device, since the last sync_sums
  int64_t seen = 0;                 // this rank's predictions (images, or tokens) since the last sync_sums
  int64_t synced_step = 0;          // the step of the last sync_sums, whose sums were finite
  Stopwatch interval;               // since the last sync_sums
  double train_seconds = 0.0;       // the epoch's steps, without its evaluation
};

}  // namespace tandem::engine
