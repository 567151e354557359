// The errors of this process's failed collectives and store operations.
#include "internal.h"

#include <mutex>

#include "tandem/dist/process_group.h"

namespace tandem::dist {
namespace {

// The messages of this process's failed collectives and store operations,
// for is_communication_failure (the first few; a failing process makes few).
std::mutex failures_mutex;
std::vector<std::string> failures;

}  // namespace

namespace internal {

void fail_communication(const std::string& message, FailureKind kind, std::vector<int64_t> unanswered) {
  {
    std::lock_guard<std::mutex> lock(failures_mutex);
    if (failures.size() < 16) failures.push_back(message);
  }
  throw CommunicationError(message, kind, std::move(unanswered));
}

}  // namespace internal

bool is_communication_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(failures_mutex);
  for (const auto& failure : failures) {
    if (message.find(failure) != std::string::npos) return true;
  }
  return false;
}

}  // namespace tandem::dist
