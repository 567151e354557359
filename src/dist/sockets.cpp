// Sockets of the rendezvous: the store's listening socket, the interface
// that reaches rank 0, and the ports launchers pick.
#include "internal.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>

#include "tandem/dist/process_group.h"

namespace tandem::dist {
namespace internal {

// Note [store address]: c10d's TCPStore server listens on every interface.
// Rank 0 instead binds the listening socket itself, to the address the job
// was given (127.0.0.1 for a single-node job), and hands it to the store
// (TCPStoreOptions::masterListenFd): a single-node job is then unreachable
// from other hosts. Returns the socket, or throws naming the address.
// With `in_use_is_error` false, a port in use gives -1 instead of the error.
int bound_listener(const std::string& host, int port, bool in_use_is_error) {
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

}  // namespace internal

namespace {

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

}  // namespace

int pick_free_port(const std::string& host) {
  // bound_listener names an address that cannot be resolved or listened on
  // at once (a store server would instead wait for its own client to
  // connect, up to 300 s).
  TANDEM_CHECK(!host.empty(), "rendezvous: the master address is empty (--master-addr / MASTER_ADDR)");
  int fd = internal::bound_listener(host, 0);  // the kernel's pick: the fallback
  auto ephemeral = first_ephemeral_port();
  if (ephemeral && *ephemeral - kFirstPickedPort >= 1000) {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> draw(kFirstPickedPort, *ephemeral - 1);
    for (int attempt = 0; attempt < 32; ++attempt) {
      int port = draw(rng);
      int drawn = internal::bound_listener(host, port, /*in_use_is_error=*/false);
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

}  // namespace tandem::dist
