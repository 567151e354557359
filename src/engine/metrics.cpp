#include "tandem/engine/metrics.h"

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "tandem/engine/atomic_file.h"
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

std::vector<EpochMetrics> read_metrics(const std::string& path) {
  std::ifstream in(path);
  TANDEM_CHECK(in.is_open(), path, ": cannot open the metrics file");
  std::vector<EpochMetrics> records;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK(j.is_object(), path, ":", number, ": not a JSON object");
    try {
      EpochMetrics m;
      m.epoch = j.at("epoch").get<int64_t>();
      m.step = j.at("step").get<int64_t>();
      m.train_loss = j.at("train_loss").get<double>();
      m.train_acc = j.at("train_acc").get<double>();
      m.evaluated = !j.at("test_acc").is_null();
      if (m.evaluated) {
        m.test_loss = j.at("test_loss").get<double>();
        m.test_acc = j.at("test_acc").get<double>();
      }
      m.epoch_seconds = j.at("epoch_seconds").get<double>();
      m.images_per_second = j.at("images_per_second").get<double>();
      m.lr = j.at("lr").get<double>();
      m.world_size = j.at("world_size").get<int64_t>();
      m.partial = j.at("partial").get<bool>();
      records.push_back(m);
    } catch (const nlohmann::json::exception& e) {
      TANDEM_CHECK(false, path, ":", number, ": not a metrics record (", e.what(), ")");
    }
  }
  TANDEM_CHECK(!in.bad(), path, ": read failed");
  return records;
}

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : path_(path) {
  check_output_file("--metrics-out", path);  // names what is wrong with the path: no folder, a folder, ...
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  TANDEM_CHECK(out_.is_open(), "--metrics-out ", path, ": cannot open for writing: ", std::strerror(errno));
}

void MetricsWriter::write(const EpochMetrics& metrics) {
  out_ << to_json_line(metrics) << '\n';
  out_.flush();
  TANDEM_CHECK(out_, "--metrics-out ", path_, ": write failed");
}

}  // namespace tandem::engine
