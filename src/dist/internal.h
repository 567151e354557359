// src/dist/internal.h: what the files of the dist layer share, and nothing
// outside it sees (it includes c10d; see tandem/dist/process_group.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "tandem/dist/communication_error.h"
#include "tandem/dist/rendezvous.h"
#include "tandem/util/check.h"

namespace tandem::dist::internal {

inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }
// "rank 3", "ranks 2 and 3", "ranks 0, 1 and 4" (up to 8 named).
inline std::string rank_list(const std::vector<int64_t>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
    text += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  }
  if (ranks.size() > 8) text += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return (ranks.size() == 1 ? "rank " : "ranks ") + text;
}

// Runs `f` on a thread of its own, left to finish alone, and returns its
// future: for store calls that may never answer (a frozen or unreachable
// rank 0), which the caller waits for only so long.
template <typename F>
auto run_detached(F f) {
  auto task = std::make_shared<std::packaged_task<decltype(f())()>>(std::move(f));
  auto future = task->get_future();
  std::thread([task] { (*task)(); }).detach();
  return future;
}

// ---- failure.cpp ---------------------------------------------------------
// Throws CommunicationError(message, ...), remembering the message for
// is_communication_failure.
[[noreturn]] void fail_communication(const std::string& message, FailureKind kind,
                                     std::vector<int64_t> unanswered = {});

// ---- sockets.cpp ---------------------------------------------------------
// Note [store address]: a listening socket bound to `host`:`port`, or
// throws naming the address; with `in_use_is_error` false, a port in use
// gives -1 instead.
int bound_listener(const std::string& host, int port, bool in_use_is_error = true);
// The address of this host's interface that reaches `host`.
std::string local_address_towards(const std::string& host);

// ---- store.cpp -----------------------------------------------------------
inline constexpr const char* kTokenKey = "tandem/job_token";
// Note [job token]'s refusal, told apart from the other errors of joining.
struct TokenRefused : Error {
  using Error::Error;
};
// Note [store deadline]: a client of rank 0's store, made within the timeout.
c10::intrusive_ptr<c10d::TCPStore> connect_to_store(const Rendezvous& r, c10d::TCPStoreOptions options);
// Note [who joined]: waits until every rank has joined, or names the missing.
void wait_for_every_rank(const Rendezvous& r, c10d::Store& store, std::chrono::milliseconds timeout);

// ---- who_did_not_come.cpp (Note [who did not come]) -----------------------
// Each group's count of the collectives it launched, for the posts at a
// timeout.
struct GroupCount {
  c10::intrusive_ptr<c10d::Store> store;  // the group's own (a duplicate's or a split's is prefixed)
  c10::intrusive_ptr<c10d::Store> root;   // the job's store, shared by all the groups of a job
  int64_t rank = 0, world = 1;            // in this group
  std::vector<int64_t> members;           // the job's rank of each rank of a split; empty: the same
  int64_t job_rank = 0, job_world = 1;    // this rank, and the ranks, of the job
  int64_t job(int64_t r) const { return members.empty() ? r : members.at(static_cast<size_t>(r)); }
  int64_t store_host = 0;  // the rank whose process serves the job's store (-1: none of the job's)
  std::atomic<int64_t> launched{0};
};
std::shared_ptr<GroupCount> counted_group(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Store> root,
                                          int64_t rank, int64_t world, int64_t store_host,
                                          std::vector<int64_t> members = {}, int64_t job_world = 0);

// A timeout's verdict: the words for the message, and the ranks named as
// not answering.
struct Verdict {
  std::string text;
  std::vector<int64_t> unanswered;
};
Verdict who_did_not_come(const std::shared_ptr<GroupCount>& group, int64_t number, const std::string& name,
                         std::chrono::milliseconds timeout);
// The same for a send or recv to or from `peer` (the job's rank).
Verdict who_did_not_answer(const std::shared_ptr<GroupCount>& group, int64_t peer, const std::string& name,
                           std::chrono::milliseconds timeout);
// Rank 0, failing for a cause other than its own timeout, keeps the store
// up for the ranks that posted at theirs.
void keep_store_for_readers(const std::shared_ptr<GroupCount>& group, std::chrono::milliseconds timeout);

}  // namespace tandem::dist::internal
