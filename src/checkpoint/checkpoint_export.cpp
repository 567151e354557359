// A checkpoint's weights by their names in the model, read without the
// model (read_checkpoint_weights in checkpoint.h, for `tandem export`).
#include <algorithm>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "checkpoint_archive.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;

// A sharded checkpoint's weights (Note [sharded checkpoints]), assembled.
CheckpointWeights read_sharded(const std::string& dir) {
  CheckpointWeights weights;
  auto c = sharded::read(dir);
  weights.fingerprint = c.header.at("fingerprint").toStringRef();
  weights.step = c.header.at("step").toInt();
  for (auto& [name, tensor] : c.tensors) {
    if (name.rfind("model.", 0) == 0) weights.tensors.emplace_back(name.substr(6), tensor);
  }
  auto metadata = c.header.find("weights_metadata");
  if (metadata != c.header.end()) {
    weights.metadata = nlohmann::json::parse(metadata->second.toStringRef()).get<std::map<std::string, std::string>>();
  }
  return weights;
}

bool is_sharded(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / sharded::kManifest, ec);
}

// One checkpoint file's weights.
CheckpointWeights read_file(const std::string& path) {
  const std::string bytes = internal::verified_archive(path);
  torch::serialize::InputArchive archive;
  CheckpointWeights weights;
  {
    internal::load_checked_archive(bytes, archive);
    c10::IValue value;
    if (!archive.try_read("format_version", value)) {
      // A rank's file of a sharded checkpoint is one piece of it, not a checkpoint.
      TANDEM_CHECK(!archive.try_read("checkpoint_id", value), "a rank's file of a sharded checkpoint, not a "
                   "checkpoint: give the checkpoint's folder (the one holding ", sharded::kManifest, ")");
      TANDEM_FAIL("not a tandem checkpoint (it holds no format_version)");
    }
    TANDEM_CHECK(value.toInt() == internal::kFormatVersion, "format version ", value.toInt(), ", expected ",
                 internal::kFormatVersion);
    archive.read("fingerprint", value);
    weights.fingerprint = value.toStringRef();
    archive.read("step", value);
    weights.step = value.toInt();
    c10::IValue model;
    TANDEM_CHECK(archive.try_read("model", model), "not a tandem checkpoint: it holds no model");
    std::vector<internal::ReadTensor> tensors;
    internal::collect_tensors(model, "", tensors);
    for (auto& t : tensors) weights.tensors.emplace_back(t.name, t.tensor.contiguous());
    if (archive.try_read("weights_metadata", value)) {  // absent from checkpoints written before it
      weights.metadata = nlohmann::json::parse(value.toStringRef()).get<std::map<std::string, std::string>>();
    }
  }
  return weights;
}

// One checkpoint's weights, a file or a sharded checkpoint's folder; throws
// tandem::Error saying what is wrong (the caller names the path).
CheckpointWeights read_one(const std::string& path) {
  CheckpointWeights weights;
  try {
    std::error_code ec;  // a folder is a sharded checkpoint's, its manifest missing or not
    weights = fs::is_directory(path, ec) ? read_sharded(path) : read_file(path);
  } catch (const tandem::Error&) {
    throw;
  } catch (const std::exception& e) {
    const std::string what = e.what();
    TANDEM_FAIL("not a readable tandem checkpoint (", what.substr(0, what.find('\n')), ")");
  }
  TANDEM_CHECK(!weights.tensors.empty(), "not a tandem checkpoint: its model holds no tensors");
  return weights;
}

}  // namespace

CheckpointWeights read_checkpoint_weights(const std::string& path) {
  std::error_code ec;
  // A sharded checkpoint's folder (checkpoint-<step>, or one holding rank
  // files), its manifest there or not, is one checkpoint; any other folder
  // a --checkpoint-dir.
  static const std::regex one(R"(checkpoint-\d{1,18})");
  auto named = fs::path(path);
  if (named.filename().empty()) named = named.parent_path();  // "dir/"
  const bool sharded_folder = is_sharded(path) || fs::exists(fs::path(path) / sharded::rank_file(0), ec) ||
                              std::regex_match(named.filename().string(), one);
  if (!fs::is_directory(path, ec) || sharded_folder) {
    try {
      return read_one(path);
    } catch (const tandem::Error& e) {
      const std::string message = e.what();
      if (message.rfind(printable(path) + ": ", 0) == 0) throw;  // it names the file already
      TANDEM_FAIL(path, ": ", message);
    }
  }
  // A --checkpoint-dir: its checkpoints newest first, the first that reads.
  std::vector<std::pair<int64_t, std::string>> found;
  static const std::regex name(R"(checkpoint-(\d+)(\.pt)?)");
  for (const auto& entry : fs::directory_iterator(path, ec)) {
    std::smatch m;
    const std::string file = entry.path().filename().string();
    std::error_code kind;  // a folder so named without its manifest is a damaged one: named below, not skipped
    if (std::regex_match(file, m, name) && m[1].length() <= 18 &&
        (m[2].matched || fs::is_directory(entry.path(), kind) || fs::is_regular_file(entry.path(), kind))) {
      found.emplace_back(std::stoll(m[1].str()), entry.path().string());
    }
  }
  TANDEM_CHECK(!ec, path, ": cannot read the folder: ", ec.message());
  TANDEM_CHECK(!found.empty(), path, ": no checkpoint in this folder (expected checkpoint-<step>.pt files or "
               "checkpoint-<step> folders, as tandem train --checkpoint-dir writes them)");
  std::sort(found.rbegin(), found.rend());
  std::string damaged;
  std::vector<std::string> passed_over;
  for (const auto& [step, file] : found) {
    try {
      auto weights = read_one(file);
      TANDEM_CHECK(weights.step == step, "its name says step ", step, ", but it holds step ", weights.step);
      weights.passed_over = passed_over;
      return weights;
    } catch (const tandem::Error& e) {
      damaged += (damaged.empty() ? "" : "; ") + file + ": " + e.what();
      passed_over.push_back(file + ": " + e.what());
    }
  }
  TANDEM_FAIL(path, ": every checkpoint in it is damaged (", damaged, ")");
}

}  // namespace tandem::checkpoint
