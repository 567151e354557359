#include "tandem/observe/profile.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include <torch/csrc/autograd/profiler_legacy.h>

#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/parse.h"

namespace tandem::observe {

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

// The events collect in memory and go to the file whole (write_atomically:
// a disk that fills up leaves no half-written trace).
struct StepProfiler::Recording {
  Recording() { profile.emplace(events); }
  std::ostringstream events;
  std::optional<torch::autograd::profiler::RecordProfile> profile;  // writes the trace when reset
};

StepProfiler::StepProfiler(ProfileOptions options, int64_t rank) : options_(std::move(options)) {
  path_ = rank_output_path(options_.path, rank);
  if (path_.empty()) return;
  // A bad folder is an error now, not after the steps before the window.
  check_output_file("--profile-out", path_);
  check_replaceable_file("--profile-out", path_);  // written whole, then renamed into place
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
    recording_ = std::make_unique<Recording>();
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
  const std::string events = recording_->events.str();
  recording_.reset();
  try {
    write_atomically(path_, [&](const std::string& tmp) {
      std::ofstream out(tmp, std::ios::binary);
      out.write(events.data(), static_cast<std::streamsize>(events.size()));
      out.close();
      TANDEM_CHECK(out, "writing the trace failed (a full disk?)");
    });
  } catch (const Error& e) {
    TANDEM_FAIL("--profile-out ", e.what());
  }
  return path_;
}

}  // namespace tandem::observe
