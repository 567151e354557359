// Configs added under names beside a family's presets (Gpt2Config's and
// LlamaConfig's add_preset: a model read from a transformers config.json):
// one table a family, safe from several threads (thread ranks).
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tandem/models/registry.h"
#include "tandem/util/check.h"

namespace tandem::models::internal {

template <typename Config>
class AddedConfigs {
 public:
  static AddedConfigs& instance() {
    static AddedConfigs table;
    return table;
  }
  // The config added under `name`, resolving the name first if it is not
  // yet (Note [model resolvers] in models/registry.h).
  bool find(const std::string& name, Config* out) {
    return find_added(name, out) || (resolve_model_name(name) && find_added(name, out));
  }
  void add(const std::string& name, const Config& config, const char* family) {
    std::lock_guard<std::mutex> lock(mutex_);
    TANDEM_CHECK(configs_.emplace(name, config).second, family, ": '", name, "' is already added");
  }
  void append_names(std::vector<std::string>& names) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : configs_) names.push_back(entry.first);
  }

 private:
  bool find_added(const std::string& name, Config* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = configs_.find(name);
    if (it == configs_.end()) return false;
    *out = it->second;
    return true;
  }
  std::mutex mutex_;
  std::map<std::string, Config> configs_;
};

}  // namespace tandem::models::internal
