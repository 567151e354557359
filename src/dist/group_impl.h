// src/dist/group_impl.h: what a Work and a ProcessGroup hold, shared by
// the files of the dist layer that make and use them (process_group.cpp,
// work.cpp, split.cpp). It includes c10d; nothing outside src/dist sees it.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include "internal.h"
#include "tandem/dist/process_group.h"

namespace tandem::dist {

// The dist layer's own files share internal.h's names.
using namespace internal;

struct Work::Impl {
  c10::intrusive_ptr<c10d::Work> work;
  std::string what;  // "all_reduce on rank 1 of 2 (gloo)"
  std::string name;  // "all_reduce"
  // Note [who did not come]: the collective's number in its group (0 for
  // send and recv), the group's store and place, and for send and recv the
  // peer.
  int64_t number = 0, peer = -1;
  std::shared_ptr<GroupCount> group;
  std::chrono::milliseconds timeout;
  bool host_wait = true;  // false: NCCL, the current stream waits (Note [waiting on NCCL])
  std::function<void()> then;  // runs once, after success
  std::mutex mutex;
  bool done = false;
  // Set by a callback on c10d's future when the collective completes
  // (steady_clock ticks; 0 until then). Shared, not owned by the callback's
  // capture of the Impl, which would be a cycle.
  std::shared_ptr<std::atomic<int64_t>> finished_ticks = std::make_shared<std::atomic<int64_t>>(0);
};

struct ProcessGroup::Impl {
  Rendezvous rendezvous;
  GroupOptions options;
  std::string backend;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;

  // A split (Note [splits] in split.cpp): the job's rank of each of this
  // group's ranks, and what the group is ("dp"); empty for the job's group
  // and its duplicates, whose ranks are the job's.
  std::vector<int64_t> members;
  std::string label;

  // Note [traffic]: counted by the collectives, read by traffic(). A
  // duplicate counts into its origin's tally too (`origin`, shared), so a
  // group's traffic includes what the parts built on it (FSDP's gathers,
  // a pipeline's hand-offs) sent over its ranks through duplicates.
  struct Tally {
    mutable std::mutex mutex;
    std::map<std::string, Traffic> by_collective;
    void add(const char* name, int64_t bytes) {
      std::lock_guard<std::mutex> lock(mutex);
      auto& t = by_collective[name];
      ++t.calls;
      t.bytes += bytes;
    }
  };
  std::shared_ptr<Tally> tally = std::make_shared<Tally>();
  std::vector<std::shared_ptr<Tally>> origins;  // the tallies of the groups this one duplicates
  void carried(const char* name, int64_t bytes) {
    tally->add(name, bytes);
    for (const auto& origin : origins) origin->add(name, bytes);
  }

  int64_t duplicates = 0;  // made so far by duplicate()
  int64_t splits = 0;      // made so far by split()
  std::shared_ptr<GroupCount> count;  // collectives launched, send and recv not counted (Note [who did not come])

  void connect();  // makes `group` over `store`

  // The job's rank of this group's rank `r`.
  int64_t job_rank(int64_t r) const { return members.empty() ? r : members.at(static_cast<size_t>(r)); }
  // This rank in messages: "rank 1 of 2", or in a split "rank 3 (1 of 2 in
  // the dp group of ranks 2 and 3)".
  std::string where() const {
    if (members.empty()) return detail::str_cat("rank ", rendezvous.rank, " of ", rendezvous.world_size);
    return detail::str_cat("rank ", job_rank(rendezvous.rank), " (", rendezvous.rank, " of ", rendezvous.world_size,
                           " in the ", label, " group of ", internal::rank_list(members), ")");
  }

  Work wrap(c10::intrusive_ptr<c10d::Work> work, const char* name, std::function<void()> then = nullptr,
            int64_t peer = -1) {
    auto impl = std::make_shared<Work::Impl>();
    impl->work = std::move(work);
    impl->what = detail::str_cat(name, " on ", where(), " (", backend, ")");
    impl->name = name;
    impl->number = peer < 0 && count ? ++count->launched : 0;
    impl->peer = peer < 0 ? peer : job_rank(peer);
    impl->group = count;
    impl->timeout = options.timeout;
    impl->host_wait = backend != "nccl";
    impl->then = std::move(then);
    // Record when it completes; send/recv works of some backends have no
    // future, and then there is no time to report.
    try {
      impl->work->getFuture()->addCallback(
          [ticks = impl->finished_ticks](c10::ivalue::Future&) {
            ticks->store(std::chrono::steady_clock::now().time_since_epoch().count());
          });
    } catch (const std::exception&) {
    }
    return Work(std::move(impl));
  }

  // A group of one: all_reduce and broadcast change nothing, so they finish
  // here, with no backend call (`then` still runs in wait()).
  Work local(std::function<void()> then = nullptr) {
    auto impl = std::make_shared<Work::Impl>();
    impl->what = "local";
    impl->timeout = options.timeout;
    impl->then = std::move(then);
    impl->finished_ticks->store(std::chrono::steady_clock::now().time_since_epoch().count());
    return Work(std::move(impl));
  }

  // Runs a c10d call, turning its immediate errors (bad shapes, a closed
  // connection) into tandem::Error naming the collective. Gloo launches hold
  // the process's launch lock (Note [one launch at a time]).
  template <typename F>
  Work call(const char* name, F&& f, std::function<void()> then = nullptr, int64_t peer = -1) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      std::unique_lock<std::mutex> lock(gloo_launch_mutex(), std::defer_lock);
      if (backend == "gloo") lock.lock();
      work = f();
    } catch (const std::exception& e) {
      fail_communication(detail::str_cat(name, " on ", where(),
                                         " (", backend, ") failed: ", first_line(e.what())),
                         FailureKind::kConnection);
    }
    return wrap(std::move(work), name, std::move(then), peer);
  }

  std::function<void()> divide_if_avg(ReduceOp op, std::vector<torch::Tensor> tensors) {
    if (op != ReduceOp::kAvg) return nullptr;
    int64_t n = rendezvous.world_size;
    return [tensors = std::move(tensors), n]() mutable {
      for (auto& t : tensors) {
        if (t.is_floating_point() || t.is_complex()) {
          t.div_(n);
        } else {
          t.div_(n, "floor");
        }
      }
    };
  }
};

}  // namespace tandem::dist
