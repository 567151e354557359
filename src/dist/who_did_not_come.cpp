// Note [who did not come]: naming the rank that did not come to a
// collective that timed out.
#include "internal.h"

#include <algorithm>
#include <mutex>

namespace tandem::dist::internal {
namespace {

using namespace std::chrono;

// The process's groups, for the posts at a timeout.
std::mutex counts_mutex;
std::vector<std::weak_ptr<GroupCount>> counts;

}  // namespace

std::shared_ptr<GroupCount> counted_group(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::Store> root,
                                          int64_t rank, int64_t world, int64_t store_host,
                                          std::vector<int64_t> members, int64_t job_world) {
  auto count = std::make_shared<GroupCount>();
  count->store = std::move(store);
  count->root = std::move(root);
  count->rank = rank;
  count->world = world;
  count->members = std::move(members);
  count->job_rank = count->job(rank);
  count->job_world = job_world > 0 ? job_world : world;
  count->store_host = store_host;
  std::lock_guard<std::mutex> lock(counts_mutex);
  counts.erase(std::remove_if(counts.begin(), counts.end(), [](const auto& c) { return c.expired(); }), counts.end());
  counts.push_back(count);
  return count;
}

namespace {

// The groups of this rank over the same job's store (ranks run as threads
// of one process, in tests, have stores of their own).
std::vector<std::shared_ptr<GroupCount>> groups_of(const GroupCount& group) {
  std::vector<std::shared_ptr<GroupCount>> found;
  std::lock_guard<std::mutex> lock(counts_mutex);
  for (const auto& weak : counts) {
    auto c = weak.lock();
    if (c && c->root == group.root && c->job_rank == group.job_rank) found.push_back(std::move(c));
  }
  return found;
}

// How long a rank whose collective timed out waits for the others' posts
// (Note [who did not come]).
std::chrono::milliseconds grace_after(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  return std::clamp<milliseconds>(timeout / 2, milliseconds(500), milliseconds(5000));
}

// Rank 0, the store's host, waits until every rank of the job that posted
// at a timeout, in any group (a split rank 0 is not in too), has read the
// others' posts, or until `until`. The job's store holds a post and a read
// mark per rank for this.
void wait_for_readers(const GroupCount& group, std::chrono::steady_clock::time_point until) {
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (int64_t r = 1; r < group.job_world && all; ++r) {
      all = !group.root->check({detail::str_cat("tandem/job-waited/", r)}) ||
            group.root->check({detail::str_cat("tandem/job-waited/read/", r)});
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Note [a silent rank] (below): the job's ranks other than `self` that have
// not posted at a timeout in any group by `until`.
std::vector<int64_t> silent_ranks(const GroupCount& group, int64_t self,
                                  std::chrono::steady_clock::time_point until) {
  std::vector<int64_t> silent;
  for (int64_t r = 0; r < group.job_world; ++r) {
    if (r != self) silent.push_back(r);
  }
  while (true) {
    silent.erase(std::remove_if(silent.begin(), silent.end(),
                                [&](int64_t r) {
                                  return group.root->check({detail::str_cat("tandem/job-waited/", r)});
                                }),
                 silent.end());
    if (silent.empty() || std::chrono::steady_clock::now() >= until) return silent;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

}  // namespace

// Note [who did not come]: a collective that times out on Gloo used to say
// only that "a peer" did not answer, which in a job of many ranks leaves the
// user to find the one that hung (stuck in its data, a deadlock, a frozen
// process) or went elsewhere. Every rank counts the collectives it launches
// on each group (send and recv, which not every rank calls, are not
// counted), so the ranks in step agree on each one's number. A rank whose
// wait times out posts, in that group's store, "tandem/waited/<rank>" =
// "<number> <name>", and in the store of each of its groups (FSDP and the
// pipeline use duplicates) "tandem/launched/<rank>" = how many collectives it
// launched there. It then waits a short grace (half the timeout, 0.5 to 5 s)
// for the other ranks' posts: the ranks stuck with it, in this group or in
// another, time out within moments and post theirs. For each other rank:
// - the same number and name: it reached this collective and waited too;
//   a later number, or a launched count at or past this one: it had
//   reached it (some collectives, FSDP's reduce_scatter among them, can
//   complete on one rank before another, which then waits elsewhere);
// - an earlier number or count: it was still before this collective;
// - the same number under another name: the ranks called different
//   collectives;
// - nothing: it did not report reaching it (it is elsewhere in the
//   program, frozen, or cut off from the store).
// This costs nothing until a timeout: no heartbeat, no store traffic per
// collective. The store calls run on a thread of their own, waited for at
// most the grace and a second more, so a store that does not answer costs
// no more than that. A store that does not answer, or whose connection
// fails, names its host: rank 0's process serves it, so it is rank 0 that
// stopped answering (frozen, stuck in the kernel, cut off) or ended; the
// diagnosis cannot ask rank 0 about itself. Rank 0 hosts the store, and its
// process ends soon after its own verdict: so each rank posts
// "tandem/waited/read/<rank>" once it has read, and rank 0 keeps the store
// up, within the grace again, until every rank of the job that posted, in
// any group (a split it is not in too), has read: each posts and marks in
// the job's store as well. Ranks are named as the job's, in a split too.
Verdict who_did_not_come(const std::shared_ptr<GroupCount>& group, int64_t number, const std::string& name,
                         std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto grace = grace_after(timeout);
  const int64_t rank = group->rank, world = group->world;
  auto key = [](const char* kind, int64_t r) { return detail::str_cat("tandem/", kind, r); };
  // What each rank posted: its waited key, else its launched count, else "".
  struct Post {
    std::string waited;
    int64_t launched = -1;
    bool any() const { return !waited.empty() || launched >= 0; }
  };
  using Posts = std::vector<Post>;
  struct Seen {
    Posts posts;
    std::vector<int64_t> silent;  // the job's ranks that posted nothing in any group (Note [a silent rank])
  };
  auto result = run_detached([=] {
    auto& store = *group->store;
    auto put = [](c10d::Store& to, const std::string& k, const std::string& value) {
      to.set(k, std::vector<uint8_t>(value.begin(), value.end()));
    };
    auto get = [](c10d::Store& from, const std::string& k) {
      auto value = from.get(k);
      return std::string(value.begin(), value.end());
    };
    put(*group->root, key("job-waited/", group->job_rank), "1");
    put(store, key("waited/", rank), detail::str_cat(number, " ", name));
    for (const auto& g : groups_of(*group)) put(*g->store, key("launched/", g->rank), std::to_string(g->launched.load()));
    Posts posts(static_cast<size_t>(world));
    const auto deadline = steady_clock::now() + grace;
    while (true) {
      int64_t missing = 0;
      for (int64_t r = 0; r < world; ++r) {
        auto& post = posts[static_cast<size_t>(r)];
        if (post.waited.empty() && store.check({key("waited/", r)})) post.waited = get(store, key("waited/", r));
        if (post.waited.empty() && store.check({key("launched/", r)})) {
          post.launched = std::atoll(get(store, key("launched/", r)).c_str());
        }
        if (!post.any()) ++missing;
      }
      if (missing == 0 || steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(milliseconds(50));
    }
    Seen seen;
    const bool all_posted = std::all_of(posts.begin(), posts.end(), [](const Post& p) { return p.any(); });
    if (all_posted && group->job_world > 1) {
      // Note [a silent rank]: every rank of this group reported, so the
      // one they wait on is elsewhere: a rank frozen in the middle of
      // another group's collective makes a chain (dp=2 x tp=2, rank 1
      // frozen: rank 0 waits for it over tp, rank 2 for rank 0 over dp),
      // and this group's verdict alone named the rank in the middle. Every
      // rank that times out posts in the job's store, so the ranks that
      // post nothing there within a grace are the chain's end.
      seen.silent = silent_ranks(*group, group->job_rank, steady_clock::now() + grace);
    }
    put(store, key("waited/read/", rank), "1");
    put(*group->root, key("job-waited/read/", group->job_rank), "1");
    if (group->job_rank == 0) wait_for_readers(*group, steady_clock::now() + grace);
    seen.posts = std::move(posts);
    return seen;
  });
  Posts posts;
  std::vector<int64_t> silent;
  // The store's host is the one that is not answering, if it is another
  // rank (Note [who did not come], above).
  const int64_t host = group->store_host;
  const bool host_named = host >= 0 && host != group->job_rank;
  try {
    // The job's posts may take a second grace, and rank 0 may linger for
    // one more.
    if (result.wait_for((group->job_rank == 0 ? 3 * grace : 2 * grace) + seconds(1)) != std::future_status::ready) {
      if (!host_named) return {"which rank is missing is not known: the job's store did not answer", {}};
      return {detail::str_cat("rank ", host, " did not answer: neither this ", name, " nor the job's store, which "
                              "rank ", host, "'s process serves, answered (rank ", host,
                              " is stopped, hung, or cut off from this rank)"),
              {host}};
    }
    auto seen = result.get();
    posts = std::move(seen.posts);
    silent = std::move(seen.silent);
  } catch (const std::exception& e) {
    if (!host_named) {
      return {detail::str_cat("which rank is missing is not known: the job's store failed (", first_line(e.what()), ")"),
              {}};
    }
    return {detail::str_cat("rank ", host, " did not answer, and the job's store that its process serves failed (",
                            first_line(e.what()), "): rank ", host, " has ended or is cut off from this rank"),
            {host}};
  }
  std::vector<int64_t> absent, reached, behind;
  std::string other;
  for (int64_t r = 0; r < world; ++r) {
    const auto& post = posts[static_cast<size_t>(r)];
    // Named by their rank in the job, as the launcher and the user know them.
    if (!post.any()) {
      absent.push_back(group->job(r));
      continue;
    }
    if (post.waited.empty()) {  // waiting in another group: how far it got in this one
      (post.launched >= number ? reached : behind).push_back(group->job(r));
      continue;
    }
    const auto space = post.waited.find(' ');
    const int64_t theirs = std::atoll(post.waited.c_str());
    const std::string their_name = space == std::string::npos ? "" : post.waited.substr(space + 1);
    if (theirs > number || (theirs == number && their_name == name)) {
      reached.push_back(group->job(r));
    } else if (theirs < number) {
      behind.push_back(group->job(r));
    } else if (other.empty()) {
      other = detail::str_cat("rank ", group->job(r), "'s collective #", number, " was ", their_name, ", this rank's ", name,
                              ": the ranks called different collectives");
    }
  }
  const auto list = rank_list;
  const std::string which = detail::str_cat("this group's collective #", number);
  std::vector<std::string> parts;
  if (!absent.empty()) {
    parts.push_back(detail::str_cat(list(absent), " did not report reaching this ", name, " (", which, "; ",
                                    list(reached), " reached it): ", absent.size() == 1 ? "it is" : "they are",
                                    " elsewhere in the program, stopped, or cut off from the job's store"));
  }
  if (!behind.empty()) {
    parts.push_back(detail::str_cat(list(behind), " had not reached it yet (", behind.size() == 1 ? "it" : "they",
                                    " waited in an earlier collective, or in another group's)"));
  }
  if (!other.empty()) parts.push_back(other);
  if (absent.empty() && !silent.empty()) {
    parts.push_back(detail::str_cat(list(silent), " of the job reported nothing, in any group: ",
                                    silent.size() == 1 ? "it is" : "they are",
                                    " stopped, hung outside a collective, or cut off from the job's store, and the "
                                    "ranks above wait on ", silent.size() == 1 ? "it" : "them"));
    std::string text;
    for (const auto& part : parts) text += (text.empty() ? "" : "; ") + part;
    return {text, silent};
  }
  if (parts.empty()) {
    return {detail::str_cat("every rank reached ", which, ": the connection between them did not carry it"), {}};
  }
  std::string text;
  for (const auto& part : parts) text += (text.empty() ? "" : "; ") + part;
  return {text, absent};  // the job's ranks
}

// A send or recv that timed out (Note [a silent rank]): its peer is named,
// unless the peer timed out too, waiting elsewhere; then the ranks of the
// job that posted nothing are (a pipeline stage waiting for the next, which
// waits over tp for a frozen rank, named the next stage).
Verdict who_did_not_answer(const std::shared_ptr<GroupCount>& group, int64_t peer, const std::string& name,
                           std::chrono::milliseconds timeout) {
  using namespace std::chrono;
  const auto grace = grace_after(timeout);
  const std::string named = detail::str_cat("rank ", peer, ", this ", name, "'s peer");
  auto result = run_detached([=] {
    auto& root = *group->root;
    root.set(detail::str_cat("tandem/job-waited/", group->job_rank), std::vector<uint8_t>{'1'});
    // How far it got in each of its groups, as a collective's timeout posts:
    // a group waiting for this rank then finds it waiting elsewhere.
    for (const auto& g : groups_of(*group)) {
      const std::string count = std::to_string(g->launched.load());
      g->store->set(detail::str_cat("tandem/launched/", g->rank), std::vector<uint8_t>(count.begin(), count.end()));
    }
    const auto until = steady_clock::now() + grace;
    bool peer_waited = false;
    while (!(peer_waited = root.check({detail::str_cat("tandem/job-waited/", peer)})) && steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(50));
    }
    std::vector<int64_t> silent;
    if (peer_waited) silent = silent_ranks(*group, group->job_rank, steady_clock::now() + grace);
    root.set(detail::str_cat("tandem/job-waited/read/", group->job_rank), std::vector<uint8_t>{'1'});
    if (group->job_rank == 0) wait_for_readers(*group, steady_clock::now() + grace);
    return std::make_pair(peer_waited, silent);
  });
  try {
    if (result.wait_for((group->job_rank == 0 ? 3 * grace : 2 * grace) + seconds(1)) != std::future_status::ready) {
      return {named, {peer}};
    }
    const auto [peer_waited, silent] = result.get();
    if (!peer_waited || silent.empty()) return {named, {peer}};
    return {detail::str_cat(named, ", timed out too, waiting elsewhere; ", rank_list(silent),
                            " of the job reported nothing, in any group: ", silent.size() == 1 ? "it is" : "they are",
                            " stopped, hung outside a collective, or cut off from the job's store"),
            silent};
  } catch (const std::exception&) {
    return {named, {peer}};
  }
}

// Note [who did not come], continued: a rank's own timeout may make Gloo
// close its pairs, so that rank 0 fails at once with "connection closed"
// instead of timing out, runs no diagnosis of its own, and ends, taking the
// store with it while the rank that timed out still reads (the likely
// cause of a store failure seen in 2 of 9 sync-bn runs with a frozen rank;
// not reproduced in a test). So rank 0, failing for any other cause, also
// keeps the store up, within the grace, until every rank that posted in one
// of its groups has read. Ranks that time out more than a grace apart do
// not see each other's posts: the later one is then named as not having
// reported.
void keep_store_for_readers(const std::shared_ptr<GroupCount>& group, std::chrono::milliseconds timeout) {
  const auto grace = grace_after(timeout);
  run_detached([group, grace] { wait_for_readers(*group, std::chrono::steady_clock::now() + grace); })
      .wait_for(grace + std::chrono::seconds(1));
}

}  // namespace tandem::dist::internal
