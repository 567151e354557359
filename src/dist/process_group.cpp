// The only file that includes c10d (see tandem/dist/process_group.h).
//
// Note [gloo headers]: c10d's ProcessGroupGloo.hpp includes five of Gloo's
// headers, which the torch wheel does not ship. They come from Debian's
// libgloo-dev (a 2022 snapshot, older than the Gloo compiled into libtorch).
// That is sound because this file only calls out-of-line functions of
// libtorch (constructors, createDeviceForHostname, the virtual collectives)
// and never instantiates Gloo code itself: the headers must compile, their
// inline contents are not used. We do not link Debian's libgloo; every Gloo
// symbol resolves in libtorch_cpu. docs/BUILD.md has the check.
#include "tandem/dist/process_group.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>

// Note [nccl headers]: c10d's ProcessGroupNCCL.hpp needs nccl.h and the CUDA
// runtime headers (the CUDA toolkit's include folder, which torch's CMake
// config adds when it finds a toolkit). ProcessGroupNCCL itself is compiled
// into the wheel's libtorch_cuda. Without those headers this build refuses
// --dist-backend nccl with a message saying so.
#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>) && __has_include(<cuda_runtime_api.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TANDEM_WITH_NCCL 1
#else
#define TANDEM_WITH_NCCL 0
#endif

#include "tandem/util/check.h"

namespace tandem::dist {

namespace {

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

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

// The errors of this process's failed collectives and store operations, for
// is_communication_failure (the first few; a failing process makes few).
std::mutex failures_mutex;
std::vector<std::string> failures;

// Throws tandem::Error(message), remembering it as a communication failure.
[[noreturn]] void fail_communication(const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(failures_mutex);
    if (failures.size() < 16) failures.push_back(message);
  }
  throw Error(message);
}

// Note [store address]: c10d's TCPStore server listens on every interface.
// Rank 0 instead binds the listening socket itself, to the address the job
// was given (127.0.0.1 for a single-node job), and hands it to the store
// (TCPStoreOptions::masterListenFd): a single-node job is then unreachable
// from other hosts. Returns the socket, or throws naming the address.
// With `in_use_is_error` false, a port in use gives -1 instead of the error.
int bound_listener(const std::string& host, int port, bool in_use_is_error = true) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  TANDEM_CHECK(rc == 0, "rendezvous: cannot resolve ", host, ": ", ::gai_strerror(rc));
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      why = std::strerror(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      ::freeaddrinfo(found);
      return fd;
    }
    int err = errno;
    ::close(fd);
    if (err == EADDRINUSE) {
      ::freeaddrinfo(found);
      if (!in_use_is_error) return -1;
      TANDEM_FAIL("rendezvous: port ", port, " on ", host,
                  " is already in use (pick another MASTER_PORT / --master-port)");
    }
    why = std::strerror(err);
  }
  ::freeaddrinfo(found);
  TANDEM_FAIL("rendezvous: cannot listen on ", host, ":", port, ": ", why);
}

// The address of this host's interface that reaches `host` (the kernel's
// routing choice, read back from a connected UDP socket; nothing is sent).
// Gloo binds its connections there: 127.0.0.1 for a single-node job, the
// right interface on each node of a multi-node one.
std::string local_address_towards(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "9", &hints, &found);
  TANDEM_CHECK(rc == 0, "rendezvous: cannot resolve ", host, ": ", ::gai_strerror(rc));
  std::string address;
  for (addrinfo* a = found; a != nullptr && address.empty(); a = a->ai_next) {
    int fd = ::socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      char text[INET6_ADDRSTRLEN] = {};
      const void* raw = local.ss_family == AF_INET
                            ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
                            : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (::inet_ntop(local.ss_family, raw, text, sizeof text) != nullptr) address = text;
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  TANDEM_CHECK(!address.empty(), "rendezvous: no local interface reaches ", host);
  return address;
}

// Note [store deadline]: c10d's TCPStore client keeps trying to connect for
// its timeout, and after a failed try may start another (up to about twice
// the timeout, with a stack trace logged for each); once connected, its
// handshake reads without any timeout, so a port held by another kind of
// server (not a store) blocks it for good. A rank other than 0 therefore
// makes its client on a thread of its own and waits for it up to the
// timeout (c10d's own set a little later, so that this message comes
// first). On time-out the thread is left behind, blocked or still trying:
// the rank ends with the error.
c10::intrusive_ptr<c10d::TCPStore> connect_to_store(const Rendezvous& r,
                                                    c10d::TCPStoreOptions options) {
  // A master address that names no host is told at once, not after the
  // whole timeout as if rank 0 had not started. A temporary failure of the
  // name service (EAI_AGAIN) is left to the store's retries.
  {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const int rc = ::getaddrinfo(r.host.c_str(), nullptr, &hints, &found);
    if (found != nullptr) ::freeaddrinfo(found);
    TANDEM_CHECK(rc == 0 || rc == EAI_AGAIN, "rendezvous at ", r.host, ":", r.port, " (", r.source,
                 "): cannot resolve ", r.host, ": ", ::gai_strerror(rc),
                 "; --master-addr (MASTER_ADDR) must name the host of rank 0");
  }
  const auto timeout = options.timeout;
  options.timeout += std::chrono::seconds(5);
  auto made = run_detached([host = r.host, options] { return c10::make_intrusive<c10d::TCPStore>(host, options); });
  TANDEM_CHECK(made.wait_for(timeout) == std::future_status::ready, "rendezvous at ", r.host, ":",
               r.port, " (", r.source, "): no store answered rank ", r.rank, " within ",
               std::chrono::duration<double>(timeout).count(), " s: rank 0 (on the node with "
               "--node-rank 0) has not started, or another program holds that port; every node "
               "must start its workers with the same --master-addr and --master-port");
  return made.get();  // the store, or its error
}

constexpr const char* kTokenKey = "tandem/job_token";

// Note [job token]'s refusal, told apart from the other errors of joining.
struct TokenRefused : Error {
  using Error::Error;
};

std::string joined_key(int64_t rank) { return "tandem/joined/" + std::to_string(rank); }

// Note [who joined]: before the backend connects, every rank posts a key of
// its own and waits for everyone's. A rank that never comes (a node not
// started, or started with another --master-addr / --master-port) is then
// named when the timeout ends, where the backend would say only which store
// key it waited for; and a second process with the same RANK (the same
// --node-rank on two nodes) is refused at once. Which ranks are missing is
// asked key by key only at the deadline (one check of all keys per poll
// before, so a large job's start-up costs the store little). Rank 0 hosts
// the store and, starting first, reaches its deadline first: it posts its
// verdict and keeps the store up a moment, so the others end with the same
// message instead of a closed connection.
void wait_for_every_rank(const Rendezvous& r, c10d::Store& store, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  constexpr const char* kVerdictKey = "tandem/joined/verdict";
  const std::string where = detail::str_cat("rendezvous at ", r.host, ":", r.port, " (", r.source, ")");
  // Ranks started for another world size (--nnodes or --nproc-per-node not
  // the same on every node) are told so, and so is every rank waiting.
  constexpr const char* kWorldKey = "tandem/joined/world";
  if (r.rank == 0) {
    const std::string world = std::to_string(r.world_size);
    store.set(kWorldKey, std::vector<uint8_t>(world.begin(), world.end()));
  } else {
    auto posted = store.get(kWorldKey);
    const std::string world(posted.begin(), posted.end());
    if (world != std::to_string(r.world_size)) {
      const std::string verdict = detail::str_cat(
          "rank ", r.rank, " was started for a job of ", r.world_size, " ranks, rank 0 for ", world,
          ": every node of the job must start its workers with the same --nnodes and --nproc-per-node");
      store.set(kVerdictKey, std::vector<uint8_t>(verdict.begin(), verdict.end()));
      TANDEM_FAIL(where, ": ", verdict);
    }
  }
  const int64_t times = store.add(joined_key(r.rank), 1);
  TANDEM_CHECK(times == 1, where, ": rank ", r.rank, " of ", r.world_size,
               " has joined already: two processes of the job have RANK=", r.rank,
               " (the same --node-rank on two nodes?)");
  std::vector<std::string> keys;
  for (int64_t k = 0; k < r.world_size; ++k) keys.push_back(joined_key(k));
  const auto deadline = Clock::now() + timeout;
  std::string verdict;
  try {
    while (!store.check(keys)) {
      if (store.check({kVerdictKey})) {  // rank 0's at its deadline, or a world size refused
        auto posted = store.get(kVerdictKey);
        // Rank 0 keeps the store up a moment for the others to read it too.
        if (r.rank == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
        TANDEM_FAIL(where, ": ", std::string(posted.begin(), posted.end()));
      }
      if (Clock::now() >= deadline) {
        std::vector<int64_t> missing;
        for (int64_t k = 0; k < r.world_size; ++k) {
          if (!store.check({keys[k]})) missing.push_back(k);
        }
        std::string names;
        for (size_t i = 0; i < missing.size() && i < 8; ++i) names += (i ? ", " : "") + std::to_string(missing[i]);
        if (missing.size() > 8) names += ", ...";
        verdict = detail::str_cat(missing.size(), " of ", r.world_size, " ranks did not join within ",
                                  timeout.count() / 1000.0, " s (rank", missing.size() > 1 ? "s " : " ", names,
                                  "); every node of the job must start its workers with the same --nnodes, "
                                  "--nproc-per-node, --master-addr, --master-port and --job-token");
        if (r.rank == 0) {
          store.set(kVerdictKey, std::vector<uint8_t>(verdict.begin(), verdict.end()));
          std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the others poll every 20 ms
        }
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {  // the store is gone (rank 0 ended without a verdict)
    if (verdict.empty()) fail_communication(detail::str_cat(where, " failed on rank ", r.rank, ": ", first_line(e.what())));
  }
  if (!verdict.empty()) TANDEM_FAIL(where, ": ", verdict);
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: a sum, divided when it completes
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMin:
      return c10d::ReduceOp::MIN;
    case ReduceOp::kMax:
      return c10d::ReduceOp::MAX;
  }
  TANDEM_FAIL("unknown reduce op");
}

// Each group's count of the collectives it launched (Note [who did not
// come]), and the process's list of them, for the posts at a timeout.
struct GroupCount {
  c10::intrusive_ptr<c10d::Store> store;  // the group's own (a duplicate's is prefixed)
  const c10d::Store* root = nullptr;      // the job's store, shared by a group and its duplicates
  int64_t rank = 0, world = 1;
  std::atomic<int64_t> launched{0};
};

std::mutex counts_mutex;
std::vector<std::weak_ptr<GroupCount>> counts;

std::shared_ptr<GroupCount> counted_group(c10::intrusive_ptr<c10d::Store> store, const c10d::Store* root,
                                          int64_t rank, int64_t world) {
  auto count = std::make_shared<GroupCount>();
  count->store = std::move(store);
  count->root = root;
  count->rank = rank;
  count->world = world;
  std::lock_guard<std::mutex> lock(counts_mutex);
  counts.erase(std::remove_if(counts.begin(), counts.end(), [](const auto& c) { return c.expired(); }), counts.end());
  counts.push_back(count);
  return count;
}

// The groups of this rank over the same job's store (ranks run as threads
// of one process, in tests, have stores of their own).
std::vector<std::shared_ptr<GroupCount>> groups_of(const GroupCount& group) {
  std::vector<std::shared_ptr<GroupCount>> found;
  std::lock_guard<std::mutex> lock(counts_mutex);
  for (const auto& weak : counts) {
    auto c = weak.lock();
    if (c && c->root == group.root && c->rank == group.rank) found.push_back(std::move(c));
  }
  return found;
}

// How long a rank whose collective timed out waits for the others' posts
// (Note [who did not come]).
std::chrono::milliseconds grace_after(std::chrono::milliseconds timeout) {
  using std::chrono::milliseconds;
  return std::clamp<milliseconds>(timeout / 2, milliseconds(500), milliseconds(5000));
}

// Rank 0, the store's host, waits until every rank that posted at a timeout
// in one of `groups` has read the others' posts, or until `until`.
void wait_for_readers(const std::vector<std::shared_ptr<GroupCount>>& groups,
                      std::chrono::steady_clock::time_point until) {
  while (std::chrono::steady_clock::now() < until) {
    bool all = true;
    for (const auto& g : groups) {
      for (int64_t r = 1; r < g->world && all; ++r) {
        all = !g->store->check({detail::str_cat("tandem/waited/", r)}) ||
              g->store->check({detail::str_cat("tandem/waited/read/", r)});
      }
    }
    if (all) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

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
// most the grace and a second more, so a store that does not answer (rank
// 0's process frozen) costs no more than that; the message then says that
// it is not known which rank is missing. Rank 0 hosts the store, and its
// process ends soon after its own verdict: so each rank posts
// "tandem/waited/read/<rank>" once it has read, and rank 0 keeps the store
// up, within the grace again, until every rank that posted in one of its
// groups has read.
std::string who_did_not_come(const std::shared_ptr<GroupCount>& group, int64_t number, const std::string& name,
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
  auto result = run_detached([=] {
    auto& store = *group->store;
    auto put = [](c10d::Store& to, const std::string& k, const std::string& value) {
      to.set(k, std::vector<uint8_t>(value.begin(), value.end()));
    };
    auto get = [](c10d::Store& from, const std::string& k) {
      auto value = from.get(k);
      return std::string(value.begin(), value.end());
    };
    put(store, key("waited/", rank), detail::str_cat(number, " ", name));
    for (const auto& g : groups_of(*group)) put(*g->store, key("launched/", rank), std::to_string(g->launched.load()));
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
    put(store, key("waited/read/", rank), "1");
    if (rank == 0) wait_for_readers(groups_of(*group), steady_clock::now() + grace);
    return posts;
  });
  Posts posts;
  try {
    // Rank 0 may linger for a second grace.
    if (result.wait_for((rank == 0 ? 2 * grace : grace) + seconds(1)) != std::future_status::ready) {
      return "which rank is missing is not known: the job's store did not answer";
    }
    posts = result.get();
  } catch (const std::exception& e) {
    return detail::str_cat("which rank is missing is not known: the job's store failed (", first_line(e.what()), ")");
  }
  std::vector<int64_t> absent, reached, behind;
  std::string other;
  for (int64_t r = 0; r < world; ++r) {
    const auto& post = posts[static_cast<size_t>(r)];
    if (!post.any()) {
      absent.push_back(r);
      continue;
    }
    if (post.waited.empty()) {  // waiting in another group: how far it got in this one
      (post.launched >= number ? reached : behind).push_back(r);
      continue;
    }
    const auto space = post.waited.find(' ');
    const int64_t theirs = std::atoll(post.waited.c_str());
    const std::string their_name = space == std::string::npos ? "" : post.waited.substr(space + 1);
    if (theirs > number || (theirs == number && their_name == name)) {
      reached.push_back(r);
    } else if (theirs < number) {
      behind.push_back(r);
    } else if (other.empty()) {
      other = detail::str_cat("rank ", r, "'s collective #", number, " was ", their_name, ", this rank's ", name,
                              ": the ranks called different collectives");
    }
  }
  auto list = [](const std::vector<int64_t>& ranks) {
    std::string text;
    for (size_t i = 0; i < ranks.size() && i < 8; ++i) {
      text += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
    }
    if (ranks.size() > 8) text += detail::str_cat(", ... (", ranks.size(), " ranks)");
    return detail::str_cat(ranks.size() == 1 ? "rank " : "ranks ", text);
  };
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
  if (parts.empty()) {
    return detail::str_cat("every rank reached ", which, ": the connection between them did not carry it");
  }
  std::string text;
  for (const auto& part : parts) text += (text.empty() ? "" : "; ") + part;
  return text;
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
  run_detached([group, grace] { wait_for_readers(groups_of(*group), std::chrono::steady_clock::now() + grace); })
      .wait_for(grace + std::chrono::seconds(1));
}

}  // namespace

// ---- Work --------------------------------------------------------------------

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
    if (!timed_out && impl_->peer < 0 && impl_->group && impl_->group->rank == 0) {
      keep_store_for_readers(impl_->group, impl_->timeout);
    }
    if (timed_out) {
      hint = detail::str_cat(" (a peer did not answer within the --dist-timeout of ", impl_->timeout.count() / 1000.0,
                             " s");
      if (impl_->peer >= 0) {
        hint += detail::str_cat(": rank ", impl_->peer, ", this ", impl_->name, "'s peer");
      } else if (impl_->number > 0 && impl_->group) {
        hint += "; " + who_did_not_come(impl_->group, impl_->number, impl_->name, impl_->timeout);
      }
      hint += ")";
    }
    fail_communication(detail::str_cat(impl_->what, " failed: ", why, hint));
  }
  if (!finished) {
    fail_communication(detail::str_cat(impl_->what, " did not finish within the timeout of ",
                                       impl_->timeout.count() / 1000.0, " s (--dist-timeout)"));
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

// ---- ProcessGroup -------------------------------------------------------------

// Note [one launch at a time]: c10d records every collective it launches in
// a process-wide flight recorder (on by default: TORCH_FR_BUFFER_SIZE). On a
// group's first launch it adds the group to the recorder's table of groups,
// a std::map written outside the recorder's lock (FlightRecorder::
// recordWithResetEnabled, libtorch 2.11). Two groups of one process
// launching at the same moment, from two threads, could corrupt that map
// and crash the process, or leave threads looping in it for ever (seen
// here: three threads spinning in recordWithResetEnabled for 85 minutes,
// without the lock). Ranks as threads in one process do exactly that (a
// DDP test crashed so in CI), and so may a program that drives several
// groups from several threads. So every Gloo launch through tandem holds one
// process-wide mutex. A Gloo launch only queues the work for the group's own
// threads (it never waits for a peer), so the lock is held for microseconds
// and cannot deadlock; the waits happen outside it. NCCL launches do not
// take it: the first one may block while the communicator forms, which
// waits for the other ranks, and NCCL ranks are processes, one per device.
// Test: ProcessGroupTest.GlooLaunchesTakeTheProcesssLaunchLock.
std::mutex& gloo_launch_mutex() {
  static std::mutex mutex;
  return mutex;
}

struct ProcessGroup::Impl {
  Rendezvous rendezvous;
  GroupOptions options;
  std::string backend;
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> group;

  int64_t duplicates = 0;  // made so far by duplicate()
  std::shared_ptr<GroupCount> count;  // collectives launched, send and recv not counted (Note [who did not come])

  void connect();  // makes `group` over `store`

  Work wrap(c10::intrusive_ptr<c10d::Work> work, const char* name, std::function<void()> then = nullptr,
            int64_t peer = -1) {
    auto impl = std::make_shared<Work::Impl>();
    impl->work = std::move(work);
    impl->what = detail::str_cat(name, " on rank ", rendezvous.rank, " of ", rendezvous.world_size,
                                 " (", backend, ")");
    impl->name = name;
    impl->number = peer < 0 && count ? ++count->launched : 0;
    impl->peer = peer;
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
      fail_communication(detail::str_cat(name, " on rank ", rendezvous.rank, " of ", rendezvous.world_size,
                                         " (", backend, ") failed: ", first_line(e.what())));
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

ProcessGroup::ProcessGroup(const Rendezvous& r, const GroupOptions& options)
    : impl_(std::make_unique<Impl>()) {
  impl_->rendezvous = r;
  impl_->options = options;
  TANDEM_CHECK(r.world_size >= 1 && r.rank >= 0 && r.rank < r.world_size,
               "process group: rank ", r.rank, " of world size ", r.world_size, " is impossible");
  TANDEM_CHECK(options.timeout.count() > 0, "--dist-timeout: expected a positive time");
  std::string backend = options.backend;
  if (backend == "auto") backend = options.device.rfind("cuda", 0) == 0 ? "nccl" : "gloo";
  TANDEM_CHECK(backend == "gloo" || backend == "nccl", "--dist-backend: expected auto, gloo or nccl, got '",
               options.backend, "'");
  if (backend == "nccl") {
    TANDEM_CHECK(TANDEM_WITH_NCCL, "--dist-backend nccl: this build has no NCCL support (it was "
                 "compiled without nccl.h; see docs/BUILD.md); use --dist-backend gloo");
    TANDEM_CHECK(torch::cuda::is_available() && torch::cuda::device_count() > 0,
                 "--dist-backend nccl: no CUDA device is visible to rank ", r.rank,
                 " (NCCL reduces CUDA tensors; use --dist-backend gloo on CPU)");
  }
  impl_->backend = backend;

  // Rendezvous: rank 0 serves the store, everyone connects (retrying until
  // the timeout, so ranks may start in any order).
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(r.port);
  store_options.isServer = r.rank == 0;
  store_options.numWorkers = static_cast<size_t>(r.world_size);
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  if (r.rank == 0) store_options.masterListenFd = bound_listener(r.host, r.port);  // Note [store address]
  try {
    impl_->store = r.rank == 0 ? c10::make_intrusive<c10d::TCPStore>(r.host, store_options)
                               : connect_to_store(r, store_options);
    // Note [job token]: rank 0 posts the job's token; the others compare
    // theirs before they join the group, so a stray process leaves nothing
    // behind in the store. (A guard against mistakes, not an attacker: the
    // store is open to anyone who reaches the port; docs/DISTRIBUTED.md.)
    if (r.rank == 0) {
      impl_->store->set(kTokenKey, std::vector<uint8_t>(r.job_token.begin(), r.job_token.end()));
    } else {
      auto posted = impl_->store->get(kTokenKey);
      if (std::string(posted.begin(), posted.end()) != r.job_token) {
        throw TokenRefused(r.job_token.empty() ? "the job has a job token and this process none"
                                               : "this process's job token does not match the job's");
      }
    }
  } catch (const TokenRefused& e) {
    TANDEM_FAIL("rendezvous at ", r.host, ":", r.port, " refused rank ", r.rank, ": ", e.what(),
                " (TANDEM_JOB_TOKEN / --job-token): it belongs to another job, or was started "
                "with the wrong token");
  } catch (const Error&) {
    throw;  // already names the rendezvous (Note [store deadline])
  } catch (const std::exception& e) {
    std::string why = first_line(e.what());
    if (r.rank == 0 && why.find("EADDRINUSE") != std::string::npos) {
      TANDEM_FAIL("rendezvous: port ", r.port, " on ", r.host,
                  " is already in use (pick another MASTER_PORT / --master-port)");
    }
    TANDEM_FAIL("rendezvous at ", r.host, ":", r.port, " (", r.source, ") failed on rank ", r.rank,
                ": ", why);
  }

  wait_for_every_rank(r, *impl_->store, options.timeout);
  impl_->connect();
  impl_->count = counted_group(impl_->store, impl_->store.get(), r.rank, r.world_size);
}

// The backend over `store` (NCCL, or Gloo with one device bound to this
// host's address on the route to rank 0's store: loopback for a local job,
// so ranks talk over the job's network).
void ProcessGroup::Impl::connect() {
  const auto& r = rendezvous;
  if (backend == "nccl") {
#if TANDEM_WITH_NCCL
    try {
      auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
      nccl_options->timeout = options.timeout;
      group = c10::make_intrusive<c10d::ProcessGroupNCCL>(
          store, static_cast<int>(r.rank), static_cast<int>(r.world_size), nccl_options);
    } catch (const std::exception& e) {
      TANDEM_FAIL("process group (nccl) of ", r.world_size, " ranks at ", r.host, ":", r.port,
                  " failed on rank ", r.rank, ": ", first_line(e.what()));
    }
#endif
    return;
  }
  try {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
    gloo_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(local_address_towards(r.host)));
    group = c10::make_intrusive<c10d::ProcessGroupGloo>(
        store, static_cast<int>(r.rank), static_cast<int>(r.world_size), gloo_options);
  } catch (const std::exception& e) {
    TANDEM_FAIL("process group (gloo) of ", r.world_size, " ranks at ", r.host, ":", r.port,
                " failed on rank ", r.rank, ": ", first_line(e.what()));
  }
}

ProcessGroup::ProcessGroup(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::shared_ptr<ProcessGroup> ProcessGroup::duplicate(const std::string& name) {
  auto impl = std::make_unique<Impl>();
  impl->rendezvous = impl_->rendezvous;
  impl->options = impl_->options;
  impl->backend = impl_->backend;
  // Numbered, so that a second duplicate of the same name never meets the
  // first one's keys in the store (every rank counts the same way).
  impl->store = c10::make_intrusive<c10d::PrefixStore>(
      "duplicate/" + std::to_string(impl_->duplicates++) + "/" + name, impl_->store);
  impl->connect();
  impl->count = counted_group(impl->store, impl_->count ? impl_->count->root : impl_->store.get(),
                              impl->rendezvous.rank, impl->rendezvous.world_size);
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(impl)));
}

ProcessGroup::~ProcessGroup() = default;
ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;

int64_t ProcessGroup::rank() const { return impl_->rendezvous.rank; }
int64_t ProcessGroup::size() const { return impl_->rendezvous.world_size; }
const std::string& ProcessGroup::backend() const { return impl_->backend; }
std::chrono::milliseconds ProcessGroup::timeout() const { return impl_->options.timeout; }
torch::Device ProcessGroup::wire_device() const {
  return impl_->backend == "nccl" ? torch::Device(impl_->options.device) : torch::Device(torch::kCPU);
}

Work ProcessGroup::all_reduce(torch::Tensor& tensor, ReduceOp op) {
  if (size() == 1) return impl_->local();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::AllreduceOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  return impl_->call("all_reduce", [&] { return impl_->group->allreduce(tensors, o); },
                     impl_->divide_if_avg(op, tensors));
}

// c10d's allreduce takes a list of copies of one tensor (one per device);
// different tensors in one operation are allreduce_coalesced.
Work ProcessGroup::all_reduce(std::vector<torch::Tensor>& tensors, ReduceOp op) {
  if (size() == 1) return impl_->local();
  c10d::AllreduceCoalescedOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  return impl_->call("all_reduce", [&] { return impl_->group->allreduce_coalesced(tensors, o); },
                     impl_->divide_if_avg(op, tensors));
}

Work ProcessGroup::broadcast(torch::Tensor& tensor, int64_t root) {
  if (size() == 1 && root == 0) return impl_->local();
  std::vector<torch::Tensor> tensors{tensor};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("broadcast", [&] { return impl_->group->broadcast(tensors, o); });
}

Work ProcessGroup::reduce(torch::Tensor& tensor, int64_t root, ReduceOp op) {
  std::vector<torch::Tensor> tensors{tensor};
  c10d::ReduceOptions o;
  o.reduceOp = to_c10d(op);
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("reduce", [&] { return impl_->group->reduce(tensors, o); },
                     rank() == root ? impl_->divide_if_avg(op, tensors) : nullptr);
}

Work ProcessGroup::all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) {
  std::vector<std::vector<torch::Tensor>> out{outputs};
  std::vector<torch::Tensor> in{input};
  c10d::AllgatherOptions o;
  o.timeout = impl_->options.timeout;
  return impl_->call("all_gather", [&] { return impl_->group->allgather(out, in, o); });
}

Work ProcessGroup::gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input,
                          int64_t root) {
  std::vector<std::vector<torch::Tensor>> out;
  if (rank() == root) out.push_back(outputs);
  std::vector<torch::Tensor> in{input};
  c10d::GatherOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("gather", [&] { return impl_->group->gather(out, in, o); });
}

Work ProcessGroup::scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                           int64_t root) {
  std::vector<torch::Tensor> out{output};
  std::vector<std::vector<torch::Tensor>> in;
  if (rank() == root) in.push_back(inputs);
  c10d::ScatterOptions o;
  o.rootRank = root;
  o.timeout = impl_->options.timeout;
  return impl_->call("scatter", [&] { return impl_->group->scatter(out, in, o); });
}

Work ProcessGroup::reduce_scatter(torch::Tensor& output, const std::vector<torch::Tensor>& inputs,
                                  ReduceOp op) {
  std::vector<torch::Tensor> out{output};
  std::vector<std::vector<torch::Tensor>> in{inputs};
  c10d::ReduceScatterOptions o;
  o.reduceOp = to_c10d(op);
  o.timeout = impl_->options.timeout;
  return impl_->call("reduce_scatter", [&] { return impl_->group->reduce_scatter(out, in, o); },
                     impl_->divide_if_avg(op, out));
}

Work ProcessGroup::barrier() {
  c10d::BarrierOptions o;
  o.timeout = impl_->options.timeout;
  return impl_->call("barrier", [&] { return impl_->group->barrier(o); });
}

Work ProcessGroup::send(const torch::Tensor& tensor, int64_t dst, int tag) {
  std::vector<torch::Tensor> tensors{tensor};
  return impl_->call("send", [&] { return impl_->group->send(tensors, static_cast<int>(dst), tag); }, nullptr, dst);
}

Work ProcessGroup::recv(torch::Tensor& tensor, int64_t src, int tag) {
  std::vector<torch::Tensor> tensors{tensor};
  return impl_->call("recv", [&] { return impl_->group->recv(tensors, static_cast<int>(src), tag); }, nullptr,
                     src);
}

bool built_with_nccl() { return TANDEM_WITH_NCCL; }

// Note [ports outside the ephemeral range]: a port picked now is bound by
// rank 0's store only later, after the workers have started. Meanwhile any
// outgoing connection on the machine (Gloo's pairs and store clients of
// other jobs, anything else) may be given that very port as its local one
// if it lies in the kernel's ephemeral range (ip_local_port_range, 32768 to
// 60999 by default), and rank 0 then fails with "port in use": seen once in
// a CI run, where a dozen jobs start while others run. So the port is drawn
// at random below that range, from kFirstPickedPort up, where the kernel
// never hands ports out by itself, and checked free by binding it; only two
// pickers drawing the same port in the same moment can still collide. Where
// the range leaves no such room, or 32 draws find nothing free, the kernel
// picks (port 0), as before.
constexpr int kFirstPickedPort = 20000;

std::optional<int> first_ephemeral_port() {
  std::ifstream file("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  if (!(file >> low >> high) || low <= 0 || high < low) return std::nullopt;
  return low;
}

int pick_free_port(const std::string& host) {
  // bound_listener names an address that cannot be resolved or listened on
  // at once (a store server would instead wait for its own client to
  // connect, up to 300 s).
  TANDEM_CHECK(!host.empty(), "rendezvous: the master address is empty (--master-addr / MASTER_ADDR)");
  int fd = bound_listener(host, 0);  // the kernel's pick: the fallback
  auto ephemeral = first_ephemeral_port();
  if (ephemeral && *ephemeral - kFirstPickedPort >= 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> draw(kFirstPickedPort, *ephemeral - 1);
    for (int attempt = 0; attempt < 32; ++attempt) {
      int port = draw(rng);
      int drawn = bound_listener(host, port, /*in_use_is_error=*/false);
      if (drawn >= 0) {
        ::close(drawn);
        ::close(fd);
        return port;
      }
    }
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  int rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  int err = errno;
  ::close(fd);
  TANDEM_CHECK(rc == 0, "cannot find a free port on ", host, ": ", std::strerror(err));
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

bool is_communication_failure(const std::string& message) {
  std::lock_guard<std::mutex> lock(failures_mutex);
  for (const auto& failure : failures) {
    if (message.find(failure) != std::string::npos) return true;
  }
  return false;
}

}  // namespace tandem::dist
