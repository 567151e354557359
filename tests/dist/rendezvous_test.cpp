// Rendezvous from torchrun's, Slurm's and Open MPI's variables, and URLs.
#include <gtest/gtest.h>

#include <map>

#include "tandem/dist/rendezvous.h"
#include "tandem/util/check.h"

namespace tandem::dist {
namespace {

EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(RendezvousTest, NoRankMeansNoGroup) { EXPECT_FALSE(rendezvous_from_env(env_of({}))); }

TEST(RendezvousTest, Torchrun) {
  auto r = rendezvous_from_env(env_of({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                       {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "node0"},
                                       {"MASTER_PORT", "1234"}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->source, "torchrun");
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->world_size, 8);
  EXPECT_EQ(r->local_rank, 1);
  EXPECT_EQ(r->local_world_size, 2);
  EXPECT_EQ(r->host, "node0");
  EXPECT_EQ(r->port, 1234);
  EXPECT_FALSE(r->agent_store);
  EXPECT_EQ(r->attempt, 0);
  // Note [agent store]: torchrun's agent serves the store; its restart count
  // numbers the attempt (tandem launch's is read too).
  r = rendezvous_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                  {"TORCHELASTIC_RESTART_COUNT", "3"}}));
  ASSERT_TRUE(r);
  EXPECT_TRUE(r->agent_store);
  EXPECT_EQ(r->attempt, 3);
  r = rendezvous_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_USE_AGENT_STORE", "False"},
                                  {"TANDEM_RESTART_COUNT", "2"}}));
  ASSERT_TRUE(r);
  EXPECT_FALSE(r->agent_store);
  EXPECT_EQ(r->attempt, 2);
}

TEST(RendezvousTest, SingleNodeDefaultsToLoopback) {
  auto r = rendezvous_from_env(env_of({{"RANK", "1"}, {"WORLD_SIZE", "2"}}));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->host, "127.0.0.1");
  EXPECT_EQ(r->port, 29500);
  EXPECT_EQ(r->local_rank, 1);
}

TEST(RendezvousTest, SlurmAndMpi) {
  auto slurm = rendezvous_from_env(env_of({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                                           {"SLURM_LOCALID", "1"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                           {"MASTER_ADDR", "n1"}}));
  ASSERT_TRUE(slurm);
  EXPECT_EQ(slurm->source, "slurm");
  EXPECT_EQ(slurm->rank, 5);
  EXPECT_EQ(slurm->local_world_size, 4);
  auto mpi = rendezvous_from_env(env_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_PORT", "4000"}}));
  ASSERT_TRUE(mpi);
  EXPECT_EQ(mpi->source, "mpi");
  EXPECT_EQ(mpi->port, 4000);
  // torchrun's names win when both are present (torchrun inside an allocation).
  auto both = rendezvous_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"SLURM_PROCID", "3"},
                                          {"SLURM_NTASKS", "4"}}));
  EXPECT_EQ(both->source, "torchrun");
}

TEST(RendezvousTest, BadVariablesAreNamed) {
  EXPECT_NE(error_of([] { rendezvous_from_env(env_of({{"RANK", "x"}, {"WORLD_SIZE", "2"}})); })
                .find("RANK=x: expected an integer >= 0"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_from_env(env_of({{"RANK", "0"}})); })
                .find("RANK is set but WORLD_SIZE is not"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_from_env(env_of({{"RANK", "2"}, {"WORLD_SIZE", "2"}})); })
                .find("rank 2 is not below the world size 2"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              rendezvous_from_env(env_of({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "99999"}}));
            }).find("MASTER_PORT: expected a port in 1..65535"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              rendezvous_from_env(
                  env_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}));
            }).find("needs MASTER_ADDR"),
            std::string::npos);
  // srun -N2 -n2: the number of nodes, no tasks per node; loopback would
  // leave the other node's ranks waiting for a store they cannot reach.
  EXPECT_NE(error_of([] {
              rendezvous_from_env(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                                          {"SLURM_LOCALID", "0"}, {"SLURM_NNODES", "2"}}));
            }).find("slurm rendezvous over 2 ranks on several nodes needs MASTER_ADDR"),
            std::string::npos);
  EXPECT_TRUE(rendezvous_from_env(env_of({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"},
                                          {"SLURM_NNODES", "1"}})));
  // A world size without a rank would otherwise run one process, silently.
  EXPECT_EQ(error_of([] { rendezvous_from_env(env_of({{"WORLD_SIZE", "2"}})); }),
            "environment variable WORLD_SIZE is set but RANK is not (set both, or neither to run "
            "one process)");
}

TEST(RendezvousTest, Url) {
  auto r = rendezvous_from_url("tcp://127.0.0.1:3456", 1, 4);
  EXPECT_EQ(r.host, "127.0.0.1");
  EXPECT_EQ(r.port, 3456);
  EXPECT_EQ(r.rank, 1);
  EXPECT_EQ(r.world_size, 4);
  EXPECT_EQ(rendezvous_from_url("tcp://[::1]:80", 0, 1).host, "::1");
  EXPECT_NE(error_of([] { rendezvous_from_url("env://", 0, 1); }).find("expected tcp://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_from_url("tcp://host", 0, 1); }).find("expected tcp://HOST:PORT"),
            std::string::npos);
  EXPECT_NE(error_of([] { rendezvous_from_url("tcp://h:1", 3, 2); }).find("rank 3"),
            std::string::npos);
}

}  // namespace
}  // namespace tandem::dist
