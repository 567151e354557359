#include "tandem/engine/run_record.h"

namespace tandem::engine {

RunRecorder::RunRecorder(const TrainOptions& o, int64_t rank, int64_t resumed_at) {
  if (rank != 0) return;
  if (!o.metrics_out.empty()) metrics_ = MetricsWriter(o.metrics_out, /*append=*/resumed_at > 0);
  if (!o.tensorboard.empty()) tensorboard_ = TensorBoardWriter(o.tensorboard, resumed_at);
}

void RunRecorder::steps(const StepRecord& r) {
  if (!tensorboard_.enabled()) return;
  Scalars scalars{{"train/loss", r.loss},
                  {"train/lr", r.lr},
                  {"train/samples_per_second", r.samples_per_second},
                  {"train/step_seconds", r.step_seconds}};
  if (r.loss_scale > 0) scalars.emplace_back("train/loss_scale", r.loss_scale);
  tensorboard_.write(r.step, scalars);
}

void RunRecorder::epoch(const EpochMetrics& m) {
  if (metrics_.enabled()) metrics_.write(m);
  if (!tensorboard_.enabled()) return;
  // The epoch's figures at its last step, tagged as --metrics-out names them.
  Scalars scalars{{"epoch/train_loss", m.train_loss},
                  {"epoch/train_acc", m.train_acc}};
  if (m.evaluated) {
    scalars.emplace_back("epoch/test_loss", m.test_loss);
    scalars.emplace_back("epoch/test_acc", m.test_acc);
  }
  scalars.emplace_back("epoch/epoch_seconds", m.epoch_seconds);
  scalars.emplace_back("epoch/images_per_second", m.images_per_second);
  scalars.emplace_back("epoch/lr", m.lr);
  tensorboard_.write(m.step, scalars);
}

}  // namespace tandem::engine
