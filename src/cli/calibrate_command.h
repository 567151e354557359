// tandem plan --calibrate FILE: this machine measured into a device
// profile (plan/calibrate.h, Note [calibrated profile]).
#pragma once

#include <string>

#include "tandem/plan/calibrate.h"

namespace tandem::cli::internal {

// Times the steps here and the links between two worker processes this
// program starts (`tandem plan --time-links`), prints the fit and writes
// the profile to `path`.
int calibrate_machine(const plan::CalibrateOptions& options, const std::string& path);

// A worker of the link timing: joins the launcher's group and, on rank 0,
// writes the times to `path` as JSON [[bytes, seconds], ...].
int time_links_worker(const std::string& path);

}  // namespace tandem::cli::internal
