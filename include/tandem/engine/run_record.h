// tandem/engine/run_record.h: where a training run's figures go.
//
// Rank 0 records the job's figures (summed over the ranks before they get
// here): one record per epoch to --metrics-out (JSON lines) and to
// --tensorboard, and, every --log-every steps, the steps since the last
// record to --tensorboard. Each sink is a part behind this one interface;
// the Trainer calls it and knows none of them.
#pragma once

#include <cstdint>
#include <string>

#include "tandem/engine/expert_load.h"
#include "tandem/engine/train_options.h"
#include "tandem/observe/metrics.h"
#include "tandem/observe/tensorboard.h"

namespace tandem::engine {

// The steps since the last record: what TensorBoard plots between epochs.
struct StepRecord {
  int64_t step = 0;               // optimizer steps taken so far
  double loss = 0.0;              // mean training loss over the interval's samples
  double lr = 0.0;                // learning rate of its last step
  double samples_per_second = 0.0;
  double step_seconds = 0.0;      // mean wall time of its steps
  double loss_scale = 0.0;        // fp16's gradient scale after it (0: none)
  ExpertLoad experts;             // a mixture of experts' routing over it (empty: none)
};

class RunRecorder {
 public:
  RunRecorder() = default;
  // Opens the sinks `options` names when `rank` is 0; a run resumed at
  // step `resumed_at` (>= 0) keeps what the sinks hold up to that step.
  RunRecorder(const TrainOptions& options, int64_t rank, int64_t resumed_at);

  void steps(const StepRecord& record);
  void epoch(const observe::EpochMetrics& metrics);
  // What opening the sinks found that the run should say (a TensorBoard
  // folder that held another run's files); empty if nothing.
  const std::string& notice() const { return notice_; }

 private:
  std::string notice_;
  observe::MetricsWriter metrics_;
  observe::TensorBoardWriter tensorboard_;
};

}  // namespace tandem::engine
