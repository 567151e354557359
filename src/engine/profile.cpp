#include "tandem/engine/profile.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <torch/csrc/autograd/profiler_legacy.h>

#include "tandem/engine/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/parse.h"

namespace tandem::engine {

ProfileOptions parse_profile_steps(const std::string& text, ProfileOptions options) {
  auto colon = text.find(':');
  std::optional<long long> first, last;
  if (colon != std::string::npos) {
    first = parse_int(text.substr(0, colon));
    last = parse_int(text.substr(colon + 1));
  }
  TANDEM_CHECK(first && last && *first >= 0 && *first < *last, "--profile-steps: expected A:B, the "
               "steps from A up to (not including) B with 0 <= A < B, e.g. 5:8; got '", text, "'");
  options.first = *first;
  options.last = *last;
  return options;
}

struct StepProfiler::Recording {
  explicit Recording(const std::string& path)
      : temporary(path + ".tmp-" + std::to_string(::getpid())), out(temporary) {
    TANDEM_CHECK(out, "--profile-out ", path, ": cannot open the file for writing");
    profile.emplace(out);
  }
  ~Recording() {
    if (!temporary.empty()) std::remove(temporary.c_str());  // not renamed into place
  }
  std::string temporary;
  std::ofstream out;
  std::optional<torch::autograd::profiler::RecordProfile> profile;  // writes the trace when reset
};

StepProfiler::StepProfiler(ProfileOptions options, int64_t rank) : options_(std::move(options)) {
  path_ = rank_output_path(options_.path, rank);
  if (path_.empty()) return;
  // A bad folder is an error now, not after the steps before the window.
  check_output_file("--profile-out", path_);
}

StepProfiler::~StepProfiler() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; finish() is called explicitly where it can
  }
}

std::string StepProfiler::before_step(int64_t step) {
  if (path_.empty()) return "";
  if (step == options_.first && !recording_) {
    recording_ = std::make_unique<Recording>(path_);
  } else if (step == options_.last) {
    return finish();
  }
  return "";
}

std::string StepProfiler::after_step(int64_t steps_done) {
  return recording_ && steps_done >= options_.last ? finish() : "";
}

std::string StepProfiler::finish() {
  if (!recording_) return "";
  recording_->profile.reset();  // the events, written
  recording_->out.flush();
  bool written = static_cast<bool>(recording_->out);
  recording_->out.close();
  written = written && !recording_->out.fail();
  std::error_code ec;
  if (written) std::filesystem::rename(recording_->temporary, path_, ec);
  if (written && !ec) recording_->temporary.clear();
  recording_.reset();  // removes the temporary file if it was not renamed
  TANDEM_CHECK(written, "--profile-out ", path_, ": writing the trace failed (a full disk?)");
  TANDEM_CHECK(!ec, "--profile-out ", path_, ": cannot rename the finished trace into place: ", ec.message());
  return path_;
}

}  // namespace tandem::engine
