#include "tandem/engine/metrics.h"

#include <nlohmann/json.hpp>

#include "tandem/util/check.h"

namespace tandem::engine {

std::string to_json_line(const EpochMetrics& m) {
  nlohmann::ordered_json j;
  j["epoch"] = m.epoch;
  j["step"] = m.step;
  j["train_loss"] = m.train_loss;
  j["train_acc"] = m.train_acc;
  if (m.evaluated) {
    j["test_loss"] = m.test_loss;
    j["test_acc"] = m.test_acc;
  } else {
    j["test_loss"] = nullptr;
    j["test_acc"] = nullptr;
  }
  j["epoch_seconds"] = m.epoch_seconds;
  j["images_per_second"] = m.images_per_second;
  j["lr"] = m.lr;
  j["world_size"] = m.world_size;
  j["partial"] = m.partial;
  return j.dump();
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc) {
  TANDEM_CHECK(out_.is_open(), "--metrics-out ", path, ": cannot open for writing");
}

void MetricsWriter::write(const EpochMetrics& metrics) {
  out_ << to_json_line(metrics) << '\n';
  out_.flush();
  TANDEM_CHECK(out_, "--metrics-out ", path_, ": write failed");
}

}  // namespace tandem::engine
