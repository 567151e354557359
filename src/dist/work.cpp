// Work: waiting for a collective, and what a failed one says.
#include <future>
#include <thread>

#include "group_impl.h"
#include "tandem/util/check.h"

namespace tandem::dist {

using namespace internal;

void Work::wait() {
  TANDEM_CHECK(impl_, "wait() on an empty Work");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->done) return;
  bool finished = !impl_->work;  // no c10d work: done locally (a group of one)
  try {
    if (impl_->work) finished = impl_->host_wait ? impl_->work->wait(impl_->timeout) : impl_->work->wait();
  } catch (const std::exception& e) {
    std::string why = first_line(e.what());
    // Gloo says "Timed out ..." for the operation that timed out, and
    // "Application timeout caused pair closure" for one that used the pair
    // it closed (FSDP's reduce_scatter, made of several).
    bool timed_out = why.find("timed out") != std::string::npos || why.find("Timed out") != std::string::npos ||
                     why.find("Application timeout") != std::string::npos;
    std::string hint;
    std::vector<int64_t> unanswered;
    if (!timed_out && impl_->peer < 0 && impl_->group && impl_->group->job_rank == 0) {
      keep_store_for_readers(impl_->group, impl_->timeout);
    }
    if (timed_out) {
      hint = detail::str_cat(" (a peer did not answer within the --dist-timeout of ", impl_->timeout.count() / 1000.0,
                             " s");
      if (impl_->peer >= 0 && impl_->group) {
        auto verdict = who_did_not_answer(impl_->group, impl_->peer, impl_->name, impl_->timeout);
        hint += ": " + verdict.text;
        unanswered = std::move(verdict.unanswered);
      } else if (impl_->peer >= 0) {
        hint += detail::str_cat(": rank ", impl_->peer, ", this ", impl_->name, "'s peer");
        unanswered = {impl_->peer};
      } else if (impl_->number > 0 && impl_->group) {
        auto verdict = who_did_not_come(impl_->group, impl_->number, impl_->name, impl_->timeout);
        hint += "; " + verdict.text;
        unanswered = std::move(verdict.unanswered);
      }
      hint += ")";
    }
    fail_communication(detail::str_cat(impl_->what, " failed: ", why, hint),
                       timed_out ? FailureKind::kTimeout : FailureKind::kConnection, std::move(unanswered));
  }
  if (!finished) {
    fail_communication(detail::str_cat(impl_->what, " did not finish within the timeout of ",
                                       impl_->timeout.count() / 1000.0, " s (--dist-timeout)"),
                       FailureKind::kTimeout);
  }
  if (impl_->then) impl_->then();
  impl_->done = true;
}

bool Work::completed() const {
  return impl_ && (impl_->done || !impl_->work || impl_->work->isCompleted());
}

std::optional<std::chrono::steady_clock::time_point> Work::finished_at() const {
  if (!impl_) return std::nullopt;
  int64_t ticks = impl_->finished_ticks->load();
  if (ticks == 0) return std::nullopt;
  return std::chrono::steady_clock::time_point(std::chrono::steady_clock::duration(ticks));
}

Work& Work::then(std::function<void()> f) {
  TANDEM_CHECK(impl_, "then() on an empty Work");
  std::lock_guard<std::mutex> lock(impl_->mutex);
  TANDEM_CHECK(!impl_->done, "then() on a Work already waited for");
  if (impl_->then) {
    impl_->then = [first = std::move(impl_->then), second = std::move(f)] {
      first();
      second();
    };
  } else {
    impl_->then = std::move(f);
  }
  return *this;
}


}  // namespace tandem::dist
