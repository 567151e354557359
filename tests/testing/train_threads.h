// `tandem train` command lines run with their ranks as threads of the test
// process (Note [a job the program made] in src/engine/trainer_setup.cpp):
// each rank its own engine::Trainer, the ranks joined in a Gloo group on
// 127.0.0.1, the flags parsed as the CLI parses them. A layout's equality
// with one process is proved without starting a process per rank (each a
// libtorch load and a rendezvous) or a Python interpreter to compare the
// weights; what needs real processes (the launcher, failures, signals) keeps
// its own tests through the CLI. The threads share the process's default
// generator (models' Note [seeded model]): a model that draws from it while
// training (dropout) draws its masks in the threads' order, so its layouts
// are compared as processes.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "testing.h"

namespace tandem::testing {

struct ThreadJob {
  std::vector<std::string> errors;  // per rank: "" when it finished
  std::string log;                  // rank 0's log (--progress lines, warnings, the account)
  bool ok() const;
  std::string report() const;  // the errors by rank, then the log
};

// Runs `tandem train FLAGS` (words separated by spaces, no quoting) with
// the ranks its --nproc-per-node names as threads; --nproc-per-node 0 or
// none: one Trainer on the calling thread, as one process. Each rank's
// collectives time out after --dist-timeout (60 s unless given), so a rank
// that failed ends the others in bounded time.
ThreadJob train_in_threads(const std::string& flags);

// A safetensors file's tensors by name.
std::map<std::string, torch::Tensor> read_weights(const std::string& path);

// The largest relative difference |a - b| / |a| (2-norms) over the
// floating-point tensors of two weights files; a test failure, and
// infinity, where their names or shapes differ.
double worst_relative_difference(const std::map<std::string, torch::Tensor>& a,
                                 const std::map<std::string, torch::Tensor>& b);

}  // namespace tandem::testing
