// The steps' traffic per dimension (step_traffic.h).
#include "tandem/engine/step_traffic.h"

namespace tandem::engine {

StepTraffic::StepTraffic(const std::vector<std::pair<std::string, std::shared_ptr<dist::ProcessGroup>>>& dims) {
  for (const auto& [name, group] : dims) {
    if (group && group->size() > 1) dims_.emplace_back(name, group);
  }
}

void StepTraffic::begin() {
  before_.clear();
  for (const auto& dim : dims_) before_.push_back(dim.second->traffic());
}

void StepTraffic::end() {
  if (before_.size() != dims_.size()) return;  // begin() was not called
  for (size_t d = 0; d < dims_.size(); ++d) {
    for (const auto& [collective, now] : dims_[d].second->traffic()) {
      auto was = before_[d].find(collective);
      const int64_t added = now.bytes - (was == before_[d].end() ? 0 : was->second.bytes);
      if (added > 0) bytes_[dims_[d].first][collective] += added;
    }
  }
  before_.clear();
  ++steps_;
}

CommBytes StepTraffic::per_step() const {
  CommBytes mean;
  if (steps_ == 0) return mean;
  for (const auto& [dim, collectives] : bytes_) {
    for (const auto& [collective, bytes] : collectives) {
      mean[dim][collective] = static_cast<double>(bytes) / static_cast<double>(steps_);
    }
  }
  return mean;
}

void StepTraffic::reset() {
  bytes_.clear();
  steps_ = 0;
}

}  // namespace tandem::engine
