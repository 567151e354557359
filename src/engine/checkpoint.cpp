#include "tandem/engine/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <regex>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/serialize.h>

#include "tandem/engine/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::engine {
namespace {

namespace fs = std::filesystem;
constexpr int64_t kFormatVersion = 1;

// checkpoint-<step>.pt files of `dir`, oldest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  static const std::regex pattern(R"(checkpoint-(\d+)\.pt)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch match;
    std::string name = entry.path().filename().string();
    if (std::regex_match(name, match, pattern)) {
      found.emplace_back(std::stoll(match[1].str()), entry.path());
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

int64_t read_int(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toInt();
}

double read_double(torch::serialize::InputArchive& archive, const char* key) {
  c10::IValue value;
  archive.read(key, value);
  return value.toDouble();
}

}  // namespace

Checkpointer::Checkpointer(CheckpointOptions options) : options_(std::move(options)) {
  TANDEM_CHECK(!options_.dir.empty(), "checkpoint directory is empty");
  TANDEM_CHECK(options_.keep >= 1, "checkpoints kept must be at least 1");
}

std::string Checkpointer::save(const TrainPosition& p, torch::nn::Module& model,
                               torch::optim::Optimizer& optimizer,
                               const std::string& fingerprint) const {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  TANDEM_CHECK(!ec, "--checkpoint-dir ", options_.dir, ": cannot create: ", ec.message());
  torch::serialize::OutputArchive archive;
  archive.write("format_version", c10::IValue(kFormatVersion));
  archive.write("fingerprint", c10::IValue(fingerprint));
  archive.write("epoch", c10::IValue(p.epoch));
  archive.write("batch_in_epoch", c10::IValue(p.batch_in_epoch));
  archive.write("step", c10::IValue(p.step));
  archive.write("epoch_loss_sum", c10::IValue(p.epoch_loss_sum));
  archive.write("epoch_correct", c10::IValue(p.epoch_correct));
  archive.write("epoch_seen", c10::IValue(p.epoch_seen));
  archive.write("loss_scale", c10::IValue(p.loss_scale));
  archive.write("scale_growth_tracker", c10::IValue(p.scale_growth_tracker));
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("cpu_rng", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);

  std::string path = (fs::path(options_.dir) / format("checkpoint-%08lld.pt",
                                                      static_cast<long long>(p.step)))
                         .string();
  write_atomically(path, [&](const std::string& tmp) { archive.save_to(tmp); });
  auto all = list_checkpoints(options_.dir);
  for (size_t i = 0; i + options_.keep < all.size(); ++i) fs::remove(all[i].second, ec);
  return path;
}

std::optional<std::string> Checkpointer::latest() const {
  auto all = list_checkpoints(options_.dir);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainPosition Checkpointer::load(const std::string& path, torch::nn::Module& model,
                                 torch::optim::Optimizer& optimizer,
                                 const std::string& fingerprint) const {
  torch::serialize::InputArchive archive;
  TrainPosition p;
  try {
    archive.load_from(path);
    int64_t version = read_int(archive, "format_version");
    TANDEM_CHECK(version == kFormatVersion, "format version ", version, ", expected ",
                 kFormatVersion);
    c10::IValue saved;
    archive.read("fingerprint", saved);
    TANDEM_CHECK(saved.toStringRef() == fingerprint,
                 "it was written by a run with other settings:\n  checkpoint: ",
                 saved.toStringRef(), "\n  this run:   ", fingerprint);
    p.epoch = read_int(archive, "epoch");
    p.batch_in_epoch = read_int(archive, "batch_in_epoch");
    p.step = read_int(archive, "step");
    p.epoch_loss_sum = read_double(archive, "epoch_loss_sum");
    p.epoch_correct = read_int(archive, "epoch_correct");
    p.epoch_seen = read_int(archive, "epoch_seen");
    c10::IValue scale;  // absent from checkpoints written before --amp
    if (archive.try_read("loss_scale", scale)) {
      p.loss_scale = scale.toDouble();
      p.scale_growth_tracker = read_int(archive, "scale_growth_tracker");
    }
    torch::serialize::InputArchive model_archive, optimizer_archive;
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    model.load(model_archive);
    optimizer.load(optimizer_archive);
    torch::Tensor rng;
    archive.read("cpu_rng", rng, /*is_buffer=*/true);
    at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle
    generator.set_state(rng);
  } catch (const tandem::Error& e) {
    TANDEM_FAIL("cannot resume from ", path, ": ", e.what());
  } catch (const std::exception& e) {
    std::string what = e.what();
    TANDEM_FAIL("cannot resume from ", path, ": not a readable tandem checkpoint (",
                what.substr(0, what.find('\n')), ")");
  }
  return p;
}

}  // namespace tandem::engine
