#include "tandem/engine/run_record.h"

#include <filesystem>
#include <fstream>

#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::engine {

RunRecorder::RunRecorder(const TrainOptions& o, int64_t rank, int64_t resumed_at) {
  if (rank != 0) return;
  // Both checked before either is opened, and the file that empties what
  // it had (--metrics-out) opened last: a sink that cannot be written
  // costs nothing already saved.
  if (!o.tensorboard.empty()) check_output_folder("--tensorboard", o.tensorboard);
  if (!o.metrics_out.empty()) check_output_file("--metrics-out", o.metrics_out);
  if (!o.tensorboard.empty()) {
    tensorboard_ = observe::TensorBoardWriter(o.tensorboard, resumed_at);
    if (resumed_at < 0 && tensorboard_.earlier_files() > 0) {
      notice_ = format("--tensorboard %s held %lld event file(s) of an earlier run: TensorBoard shows this run "
                       "there in their place (give each run a folder of its own to compare them)",
                       printable(o.tensorboard).c_str(), static_cast<long long>(tensorboard_.earlier_files()));
    }
  }
  if (!o.metrics_out.empty()) metrics_ = observe::MetricsWriter(o.metrics_out, /*append=*/resumed_at > 0);
  // The effective configuration (--config), now that the run is accepted:
  // a refused run leaves the one beside the earlier metrics and checkpoints.
  auto write_config = [&](const std::string& path) {
    write_atomically(path, [&](const std::string& tmp) {
      std::ofstream out(tmp);
      out << o.effective_config;
      TANDEM_CHECK(out.good(), "cannot write the run's configuration to ", path);
    });
  };
  if (!o.effective_config.empty() && !o.metrics_out.empty()) {
    const std::filesystem::path metrics(o.metrics_out);
    write_config((metrics.parent_path() / (metrics.stem().string() + ".config.toml")).string());
  }
  if (!o.effective_config.empty() && !o.checkpoint_dir.empty()) {
    std::filesystem::create_directories(o.checkpoint_dir);
    write_config(o.checkpoint_dir + "/config.toml");
  }
}

void RunRecorder::steps(const StepRecord& r) {
  if (!tensorboard_.enabled()) return;
  observe::Scalars scalars{{"train/loss", r.loss},
                  {"train/lr", r.lr},
                  {"train/samples_per_second", r.samples_per_second},
                  {"train/step_seconds", r.step_seconds}};
  if (r.loss_scale > 0) scalars.emplace_back("train/loss_scale", r.loss_scale);
  if (!r.experts.empty()) {
    scalars.emplace_back("router/balance_loss", r.experts.balance_loss);
    for (size_t e = 0; e < r.experts.share.size(); ++e) {
      scalars.emplace_back(format("router/expert_%03zu_share", e), r.experts.share[e]);
    }
  }
  tensorboard_.write(r.step, scalars);
}

void RunRecorder::epoch(const observe::EpochMetrics& m) {
  if (metrics_.enabled()) metrics_.write(m);
  if (!tensorboard_.enabled()) return;
  // The epoch's figures at its last step, tagged as --metrics-out names them.
  observe::Scalars scalars{{"epoch/train_loss", m.train_loss},
                  {"epoch/train_acc", m.train_acc}};
  if (m.evaluated) {
    scalars.emplace_back("epoch/test_loss", m.test_loss);
    scalars.emplace_back("epoch/test_acc", m.test_acc);
  }
  scalars.emplace_back("epoch/epoch_seconds", m.epoch_seconds);
  scalars.emplace_back("epoch/images_per_second", m.images_per_second);
  scalars.emplace_back("epoch/lr", m.lr);
  scalars.emplace_back("epoch/world_size", static_cast<double>(m.world_size));
  scalars.emplace_back("epoch/partial", m.partial ? 1.0 : 0.0);
  if (m.tokens_per_second > 0) {
    scalars.emplace_back("epoch/tokens_per_second", m.tokens_per_second);
    if (m.mfu > 0) scalars.emplace_back("epoch/mfu", m.mfu);
    if (m.evaluated) scalars.emplace_back("epoch/test_perplexity", observe::perplexity(m.test_loss));
    if (m.text && m.evaluated) scalars.emplace_back("epoch/test_bits_per_byte", observe::bits_per_byte(m.test_loss));
  }
  tensorboard_.write(m.step, scalars);
}

}  // namespace tandem::engine
