#include "tandem/dist/rendezvous.h"

#include "tandem/util/check.h"
#include "tandem/util/env.h"
#include "tandem/util/parse.h"

namespace tandem::dist {

namespace {

struct Names {
  const char* source;
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  // The job's number of nodes, where the launcher says it even when it does
  // not give the processes per node (srun -N2 sets SLURM_NNODES but sets
  // SLURM_NTASKS_PER_NODE only with --ntasks-per-node); null: none.
  const char* nodes;
};

constexpr Names kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", nullptr},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE",
     "SLURM_NNODES"},
    {"mpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr},
};

int64_t read_int(const EnvLookup& lookup, const char* name, int64_t fallback, int64_t min) {
  auto text = lookup(name);
  if (!text) return fallback;
  // Slurm writes SLURM_NTASKS_PER_NODE as "4" or "4(x2)"; the count comes first.
  std::string value = text->substr(0, text->find('('));
  auto parsed = parse_int(value);
  TANDEM_CHECK(parsed && *parsed >= min, "environment variable ", name, "=", *text,
               ": expected an integer >= ", min);
  return *parsed;
}

int parse_port(const std::string& text, const std::string& what) {
  auto port = parse_int(text);
  TANDEM_CHECK(port && *port > 0 && *port < 65536, what, ": expected a port in 1..65535, got '",
               text, "'");
  return static_cast<int>(*port);
}

void check_ranks(const Rendezvous& r) {
  TANDEM_CHECK(r.rank < r.world_size, r.source, " rendezvous: rank ", r.rank,
               " is not below the world size ", r.world_size);
  TANDEM_CHECK(r.local_rank < r.local_world_size, r.source, " rendezvous: local rank ",
               r.local_rank, " is not below the local world size ", r.local_world_size);
}

}  // namespace

std::optional<Rendezvous> rendezvous_from_env(const EnvLookup& lookup) {
  // torchrun's world size without a rank is a job set up by hand and cut
  // short: running alone instead would silently train on one process.
  TANDEM_CHECK(!lookup("WORLD_SIZE") || lookup("RANK"),
               "environment variable WORLD_SIZE is set but RANK is not (set both, or neither to "
               "run one process)");
  for (const auto& names : kLaunchers) {
    if (!lookup(names.rank)) continue;
    Rendezvous r;
    r.source = names.source;
    r.rank = read_int(lookup, names.rank, 0, 0);
    TANDEM_CHECK(lookup(names.world_size), "environment variable ", names.rank,
                 " is set but ", names.world_size, " is not");
    r.world_size = read_int(lookup, names.world_size, 1, 1);
    r.local_rank = read_int(lookup, names.local_rank, r.rank, 0);
    r.local_world_size = read_int(lookup, names.local_world_size, r.world_size, 1);
    if (auto host = lookup("MASTER_ADDR")) {
      TANDEM_CHECK(!host->empty(), "environment variable MASTER_ADDR is empty");
      r.host = *host;
    } else {
      const int64_t nodes = names.nodes ? read_int(lookup, names.nodes, 1, 1) : 1;
      TANDEM_CHECK(r.local_world_size == r.world_size && nodes == 1, r.source, " rendezvous over ",
                   r.world_size, " ranks on several nodes needs MASTER_ADDR (rank 0's host)");
    }
    if (auto port = lookup("MASTER_PORT")) r.port = parse_port(*port, "MASTER_PORT");
    if (auto token = lookup("TANDEM_JOB_TOKEN")) r.job_token = *token;
    // Note [agent store]: torchrun's agent serves the store, as PyTorch's
    // own env:// rendezvous reads it (torch/distributed/rendezvous.py).
    r.agent_store = lookup("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    r.attempt = read_int(lookup, "TORCHELASTIC_RESTART_COUNT", read_int(lookup, "TANDEM_RESTART_COUNT", 0, 0), 0);
    check_ranks(r);
    return r;
  }
  return std::nullopt;
}

std::optional<Rendezvous> rendezvous_from_env() {
  return rendezvous_from_env([](const std::string& name) { return env::get(name); });
}

Rendezvous rendezvous_from_url(const std::string& url, int64_t rank, int64_t world_size) {
  const std::string scheme = "tcp://";
  TANDEM_CHECK(url.rfind(scheme, 0) == 0, "init method '", url, "': expected tcp://HOST:PORT");
  std::string rest = url.substr(scheme.size());
  Rendezvous r;
  r.source = "url";
  size_t colon;
  if (!rest.empty() && rest[0] == '[') {  // [v6::address]:port
    auto close = rest.find(']');
    TANDEM_CHECK(close != std::string::npos && close + 1 < rest.size() && rest[close + 1] == ':',
                 "init method '", url, "': expected tcp://[IPV6]:PORT");
    r.host = rest.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = rest.rfind(':');
    TANDEM_CHECK(colon != std::string::npos && colon > 0, "init method '", url,
                 "': expected tcp://HOST:PORT");
    r.host = rest.substr(0, colon);
  }
  r.port = parse_port(rest.substr(colon + 1), "init method '" + url + "'");
  TANDEM_CHECK(world_size >= 1, "init method '", url, "': world size must be >= 1, got ",
               world_size);
  TANDEM_CHECK(rank >= 0, "init method '", url, "': rank must be >= 0, got ", rank);
  r.rank = rank;
  r.world_size = world_size;
  r.local_rank = rank;
  r.local_world_size = world_size;
  check_ranks(r);
  return r;
}

}  // namespace tandem::dist
