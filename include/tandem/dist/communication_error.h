// tandem/dist/communication_error.h: the error of a collective or of the
// job's store that failed, with its facts.
//
// What failed (a timeout, a peer gone, the store) and which ranks this rank
// found not answering travel with the error as fields, not as words of its
// message: the CLI hands them to the launcher (Note [first failure] in
// tandem/launch/worker_error.h), which names the rank that stopped
// answering rather than the one that waited for it.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "tandem/util/check.h"
#include "tandem/util/message.h"

namespace tandem::dist {

enum class FailureKind {
  kTimeout,     // a peer did not answer within --dist-timeout
  kConnection,  // a connection closed or failed (a peer that ended, a cut link)
  kStore,       // the job's store failed or did not answer
};

class CommunicationError : public Error {
 public:
  CommunicationError(const std::string& message, FailureKind kind, std::vector<int64_t> unanswered = {})
      : Error(message), kind_(kind), unanswered_(std::move(unanswered)) {}
  FailureKind kind() const { return kind_; }
  // The ranks of the job this rank found not answering (empty when it could
  // not tell): a timeout's missing ranks, a send or recv's peer, or rank 0
  // when the store it hosts went silent.
  const std::vector<int64_t>& unanswered() const { return unanswered_; }

 private:
  FailureKind kind_;
  std::vector<int64_t> unanswered_;
};

// Throws `e` again with `prefix` before its message (libtorch's stack trace
// left out), keeping the facts of a CommunicationError and the kind of a
// UsageError; any other error becomes a tandem::Error. For code that adds
// where an error happened (a pipeline stage) without hiding what it was.
[[noreturn]] inline void rethrow_with_context(const std::string& prefix, const std::exception& e) {
  const std::string message = prefix + message_of(e);
  if (const auto* failed = dynamic_cast<const CommunicationError*>(&e)) {
    throw CommunicationError(message, failed->kind(), failed->unanswered());
  }
  if (dynamic_cast<const UsageError*>(&e) != nullptr) throw UsageError(message);
  throw Error(message);
}

}  // namespace tandem::dist
