// Joining the job's store: a client within the timeout, and every rank
// accounted for before the backend connects.
#include "internal.h"

#include <netdb.h>
#include <sys/socket.h>

#include <thread>

namespace tandem::dist::internal {

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
               std::chrono::duration<double>(timeout).count(), " s: ",
               r.agent_store ? "the launcher's agent (torchrun) that serves it has gone, or another program "
                               "holds that port"
                             : "rank 0 (on the node with --node-rank 0) has not started, or another program "
                               "holds that port; every node must start its workers with the same --master-addr "
                               "and --master-port");
  return made.get();  // the store, or its error
}

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
    if (verdict.empty()) fail_communication(detail::str_cat(where, " failed on rank ", r.rank, ": ", first_line(e.what())),
                                          FailureKind::kStore);
  }
  if (!verdict.empty()) TANDEM_FAIL(where, ": ", verdict);
}

}  // namespace tandem::dist::internal
