// tandem/observe/profile.h: a Chrome trace of a window of training steps.
//
//   StepProfiler profiler({"trace-{rank}.json", /*first=*/5, /*last=*/8}, rank);
//   for (...) { profiler.before_step(step); ... the step ...; profiler.after_step(step + 1); }
//   profiler.finish();   // (also on destruction)
//
// libtorch's own profiler (torch::autograd::profiler::RecordProfile, its
// legacy C++ profiler, which writes the trace itself) records every ATen operator and
// every RECORD_USER_SCOPE from the start of step `first` to the start of
// step `last`, on the thread that runs the loop and on the threads that
// inherit its state (the pipeline's stage threads and DataParallel's
// replica threads do, each a tid of its own in the trace; Gloo's and the
// loader's threads do not), and writes them as a JSON array of Chrome trace events
// (chrome://tracing, Perfetto's UI). The trainer marks its phases with
// RECORD_USER_SCOPE: tandem::step, tandem::forward, tandem::backward,
// tandem::reduce (DDP's wait or seed 004's all-reduce), tandem::optimizer,
// tandem::pipeline, tandem::next_batch. Outside the window a scope costs a
// check of a global flag.
//
// Steps are counted from 0 in the run's numbering (a resumed run's steps
// continue the checkpoint's). A window the run never reaches writes nothing;
// one it stops inside is written when the run ends.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace tandem::observe {

struct ProfileOptions {
  std::string path;   // "{rank}" becomes the rank; empty: off
  int64_t first = 5;  // the first step traced
  int64_t last = 8;   // the first step not traced (> first)
};

// Parses --profile-steps' "A:B" (0 <= A < B) into `options`; throws
// tandem::Error naming the flag otherwise.
ProfileOptions parse_profile_steps(const std::string& text, ProfileOptions options = {});

class StepProfiler {
 public:
  // Off when options.path is empty, or when it has no "{rank}" and this is
  // not rank 0 (one trace for the job, as with --metrics-out). Throws
  // tandem::Error naming --profile-out when the file's folder is not one
  // this process can write to.
  StepProfiler(ProfileOptions options, int64_t rank);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // Starts the trace at step `first`, writes it at step `last`; returns the
  // file written then, or "".
  std::string before_step(int64_t step);
  // Writes the trace once `steps_done` steps have run, if the window ends
  // there (so the trace ends with the last step of the window, not with
  // what follows it, such as the run's last evaluation); returns the file
  // written then, or "".
  std::string after_step(int64_t steps_done);
  // Writes the trace if one is open (to PATH.tmp-PID, then renamed: a disk
  // that fills up leaves no half-written trace). Returns the file written, or "".
  std::string finish();
  bool enabled() const { return !path_.empty(); }
  const ProfileOptions& options() const { return options_; }
  const std::string& path() const { return path_; }

 private:
  struct Recording;
  ProfileOptions options_;
  std::string path_;
  std::unique_ptr<Recording> recording_;
};

}  // namespace tandem::observe
