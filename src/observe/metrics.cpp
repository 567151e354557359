#include "tandem/observe/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::observe {

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
  if (!m.comm_bytes_per_step.empty()) j["comm_bytes_per_step"] = m.comm_bytes_per_step;
  if (m.peak_memory_bytes > 0) j["peak_memory_bytes"] = m.peak_memory_bytes;
  if (m.tokens_per_second > 0) {
    j["tokens_per_second"] = m.tokens_per_second;
    if (m.mfu > 0) j["mfu"] = m.mfu;
    j["text"] = m.text;
    j["train_perplexity"] = perplexity(m.train_loss);
    if (m.evaluated) j["test_perplexity"] = perplexity(m.test_loss);
    if (m.text) {
      j["train_bits_per_byte"] = bits_per_byte(m.train_loss);
      if (m.evaluated) j["test_bits_per_byte"] = bits_per_byte(m.test_loss);
    }
  }
  return j.dump();
}

double perplexity(double loss_nats) { return std::exp(loss_nats); }
double bits_per_byte(double loss_nats_per_byte) { return loss_nats_per_byte / std::log(2.0); }

std::vector<EpochMetrics> read_metrics(const std::string& path) {
  std::istringstream in(read_regular_file(path, "a metrics file"));
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
      if (j.contains("comm_bytes_per_step")) {
        m.comm_bytes_per_step = j.at("comm_bytes_per_step").get<std::map<std::string, std::map<std::string, double>>>();
      }
      m.peak_memory_bytes = j.value("peak_memory_bytes", int64_t{0});
      if (j.contains("tokens_per_second")) {
        m.tokens_per_second = j.at("tokens_per_second").get<double>();
        m.mfu = j.value("mfu", 0.0);
        m.text = j.value("text", false);
      }
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
  fd_ = open_lines_output("--metrics-out", path, append);
}

MetricsWriter::MetricsWriter(MetricsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

MetricsWriter& MetricsWriter::operator=(MetricsWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

MetricsWriter::~MetricsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsWriter::write(const EpochMetrics& metrics) {
  const std::string line = to_json_line(metrics) + '\n';
  // What was printed before it comes first where the file is this
  // process's own output (--metrics-out /dev/stdout).
  std::fflush(stdout);
  std::fflush(stderr);
  write_all(fd_, line, "--metrics-out " + printable(path_));
}

}  // namespace tandem::observe
