// tandem/engine/step_traffic.h: what the training steps sent over each
// dimension of the job's layout, counted by the process groups (Note
// [traffic] in dist/process_group.h), for the epoch's record.
//
//   StepTraffic traffic({{"dp", group}, {"pp", stages}});
//   traffic.begin(); step(...); traffic.end();   // around each step only
//   metrics.comm_bytes_per_step = traffic.per_step();
//
// Only the steps are counted: the metrics' reductions between them, the
// evaluation and the checkpoints' gathers are not, so the figures are the
// parallelism's own and can be compared with its analytic ones
// (bench/mesh_traffic.py). Every rank counts its own; rank 0 records.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/dist/process_group.h"

namespace tandem::engine {

// Bytes per step by dimension ("dp", "pp") and collective ("all_reduce").
using CommBytes = std::map<std::string, std::map<std::string, double>>;

class StepTraffic {
 public:
  StepTraffic() = default;
  // Null groups and groups of one are left out.
  explicit StepTraffic(const std::vector<std::pair<std::string, std::shared_ptr<dist::ProcessGroup>>>& dims);

  void begin();  // before a step
  void end();    // after it: what it added is counted
  // The mean over the steps counted since the last reset(); empty when none.
  CommBytes per_step() const;
  void reset();

 private:
  std::vector<std::pair<std::string, std::shared_ptr<dist::ProcessGroup>>> dims_;
  std::vector<std::map<std::string, dist::Traffic>> before_;
  std::map<std::string, std::map<std::string, int64_t>> bytes_;
  int64_t steps_ = 0;
};

}  // namespace tandem::engine
