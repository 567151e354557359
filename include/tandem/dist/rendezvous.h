// tandem/dist/rendezvous.h: where the ranks of a job meet, and who is who.
//
// A job's processes learn their rank, the world size and the address of
// rank 0's store from their environment, in the names the common launchers
// use, looked for in this order:
//   torchrun / tandem launch   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Slurm (srun)               SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//                              SLURM_NTASKS_PER_NODE
//   Open MPI (mpirun)          OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                              OMPI_COMM_WORLD_LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_SIZE
// and MASTER_ADDR / MASTER_PORT for the store (default 127.0.0.1:29500 when
// the job is on one node), TANDEM_JOB_TOKEN (Note [job token]), and under
// torchrun TORCHELASTIC_USE_AGENT_STORE and TORCHELASTIC_RESTART_COUNT
// (Note [agent store]). Or from a URL, tcp://HOST:PORT, with the rank and
// world size given explicitly (seed 002's init_method).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace tandem::dist {

struct Rendezvous {
  std::string host = "127.0.0.1";  // rank 0's store
  int port = 29500;
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t local_rank = 0;
  int64_t local_world_size = 1;
  std::string source;  // "torchrun", "slurm", "mpi" or "url", for messages
  // Note [job token]: every process of a job carries the same token
  // (TANDEM_JOB_TOKEN, set by tandem launch); one whose token differs from
  // rank 0's is refused before it touches the group. Empty: no token.
  std::string job_token;
  // Note [agent store]: torchrun's agent serves the store at MASTER_ADDR:
  // MASTER_PORT itself (TORCHELASTIC_USE_AGENT_STORE=True), so every rank,
  // rank 0 included, joins it as a client and none binds the port; tandem's
  // keys go under one prefix per attempt (`attempt`: the launcher's restart
  // count, TORCHELASTIC_RESTART_COUNT or TANDEM_RESTART_COUNT), since the
  // agent's store outlives the workers it restarts.
  bool agent_store = false;
  int64_t attempt = 0;
};

// Reads a variable; nullopt when unset. Tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The rendezvous the environment describes, or nullopt when it names no
// rank at all (a plain single process). Throws tandem::Error naming the
// variable when one is set but malformed or inconsistent (rank >= world size).
std::optional<Rendezvous> rendezvous_from_env(const EnvLookup& lookup);
std::optional<Rendezvous> rendezvous_from_env();  // the process environment

// tcp://HOST:PORT (IPv6 hosts in brackets) with an explicit rank and size.
Rendezvous rendezvous_from_url(const std::string& url, int64_t rank, int64_t world_size);

}  // namespace tandem::dist
