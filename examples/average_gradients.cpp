// examples/average_gradients.cpp: distributed training by hand (a hand-written data-parallel loop).
//
//   ./average_gradients --processes 2          # starts 2 workers of itself
//   tandem launch --nproc-per-node 2 -- ./average_gradients   # or any launcher
//
// Started alone, the program starts --processes copies of itself as the
// job's workers and waits for them, as a hand-written script does with
// torch.multiprocessing (tandem::launch::run_workers: each worker gets
// RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT; a worker that fails stops
// the others). Started by a launcher, it is one of the workers: it joins
// the group, takes its part of the data from a DataPartitioner
// (equal fractions, seed 1234), and after every backward averages the
// gradients over the workers itself (tandem::dist::average_gradients, seed
// 004's average_gradients) before its optimizer steps. Every worker thus
// takes the same steps and prints the same checksum of its weights.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "example.h"

int main(int argc, char** argv) {
  return example::run("average_gradients", [&] {
    int64_t processes = 2, epochs = 8, batch = 32;
    tandem::cli::FlagSet flags("average_gradients", "distributed training by hand");
    flags.add_int("processes", "N", &processes, "workers to start when started alone", 1);
    flags.add_int("epochs", "N", &epochs, "epochs to train", 1);
    flags.add_int("batch", "B", &batch, "images per step on each worker", 1);
    if (!example::parse_flags(flags, argc, argv)) return 0;

    auto rendezvous = tandem::dist::rendezvous_from_env();
    if (!rendezvous) {  // started alone: start the workers, this program again
      tandem::launch::LaunchOptions launch;
      launch.nproc_per_node = processes;
      launch.command = {std::filesystem::read_symlink("/proc/self/exe").string()};
      launch.command.insert(launch.command.end(), argv + 1, argv + argc);
      auto result = tandem::launch::run_workers(launch, [] { return tandem::dist::pick_free_port(); });
      if (result.exit_code != 0) std::fprintf(stderr, "average_gradients: %s\n", result.summary().c_str());
      return result.exit_code;
    }

    tandem::dist::GroupOptions group_options;
    group_options.backend = "gloo";
    auto group = std::make_shared<tandem::dist::ProcessGroup>(*rendezvous, group_options);
    const int64_t rank = group->rank(), world = group->size();

    auto data = example::regression_data();
    auto parts = tandem::data::partition_indices(data.x.size(0), std::vector<double>(world, 1.0 / world),
                                                 /*seed=*/1234);
    auto mine = torch::tensor(parts[rank]);  // this worker's part, disjoint from the others'
    TANDEM_CHECK_USAGE(mine.size(0) >= batch, "--batch ", batch, " is more than a worker's part of ", mine.size(0),
                       " samples");

    torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
    tandem::dist::broadcast_module(*model, *group);  // rank 0's weights everywhere
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double loss_sum = 0;
      int64_t steps = 0;
      for (int64_t start = 0; start + batch <= mine.size(0); start += batch) {
        auto index = mine.narrow(0, start, batch);
        sgd.zero_grad();
        auto loss = torch::mse_loss(model->forward(data.x.index_select(0, index)), data.y.index_select(0, index));
        loss.backward();
        tandem::dist::average_gradients(*model, *group);  // every gradient all-reduced and divided by the world
        sgd.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      example::print_epoch_loss(*group, epoch + 1, loss_sum, steps);
    }
    example::print_rank_checksum(*group, *model);
    return 0;
  });
}
