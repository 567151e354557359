// Weight shards of a transformers folder (hf_shards.h, Note [weight shards]).
#include "hf_shards.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"

namespace tandem::checkpoint::internal {

void write_weight_shards(const std::string& dir, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata, double max_shard_bytes) {
  namespace fs = std::filesystem;
  TANDEM_CHECK(max_shard_bytes > 0, "the largest shard must be positive, got ", max_shard_bytes, " bytes");
  std::vector<NamedTensors> shards(1);
  double shard_bytes = 0, total = 0;
  for (const auto& [name, t] : tensors) {
    const double bytes = double(t.numel()) * double(t.element_size());
    if (!shards.back().empty() && shard_bytes + bytes > max_shard_bytes) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().emplace_back(name, t);
    shard_bytes += bytes;
    total += bytes;
  }
  // What an earlier export of the other form left.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    const bool old_shard = name.rfind("model-", 0) == 0 && name.find("-of-") != std::string::npos &&
                           entry.path().extension() == ".safetensors";
    if (old_shard || (shards.size() > 1 && name == "model.safetensors") ||
        (shards.size() == 1 && name == "model.safetensors.index.json")) {
      fs::remove(entry.path(), ec);
    }
  }
  if (shards.size() == 1) {
    write_safetensors(dir + "/model.safetensors", shards.front(), metadata);
    return;
  }
  nlohmann::json weight_map = nlohmann::json::object();
  for (size_t i = 0; i < shards.size(); ++i) {
    char file[64];
    std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
    write_safetensors(dir + "/" + file, shards[i], metadata);
    for (const auto& [name, t] : shards[i]) weight_map[name] = file;
  }
  const nlohmann::json index = {{"metadata", {{"total_size", static_cast<int64_t>(total)}}},
                                {"weight_map", weight_map}};
  write_atomically(dir + "/model.safetensors.index.json", [&](const std::string& tmp) {
    std::ofstream out(tmp, std::ios::trunc);
    out << index.dump(2) << "\n";
    TANDEM_CHECK(out.good(), tmp, ": cannot write the index of the shards");
  });
}

}  // namespace tandem::checkpoint::internal
