// examples/ddp.cpp: a training loop of one's own with tandem's
// DistributedDataParallel, the C++ counterpart of PyTorch's DDP tutorial
// (the usual recipe, on a small regression so that it runs in seconds).
//
//   tandem launch --nproc-per-node 2 -- ./ddp    # 2 processes
//   torchrun --nproc-per-node 2 ./ddp            # the same, torchrun's way
//   ./ddp                                        # one process
//
// Every process joins the job's group (Gloo, from the launcher's
// environment), wraps its model in DistributedDataParallel (which hands
// rank 0's weights to every rank), reads its share of each global batch
// through a DistributedSampler and steps on gradients averaged over the
// ranks. The global batch stays --global-batch whatever the number of
// processes, so 1, 2 or 4 processes end with the same weights, to rounding:
// each rank prints a checksum of its weights to show it.
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "example.h"

int main(int argc, char** argv) {
  return example::run("ddp", [&] {
    int64_t epochs = 8, global_batch = 64;
    std::string weights_out;
    tandem::cli::FlagSet flags("ddp", "DistributedDataParallel in a training loop of one's own");
    flags.add_int("epochs", "N", &epochs, "epochs to train", 1);
    flags.add_int("global-batch", "B", &global_batch, "images per step over all processes", 1);
    flags.add_string("weights-out", "FILE", &weights_out, "rank 0 saves the final parameters there (torch::save)");
    if (!example::parse_flags(flags, argc, argv)) return 0;

    // The job: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from tandem launch
    // (or torchrun, srun, mpirun); none of them set means one process.
    auto rendezvous = tandem::dist::rendezvous_from_env();
    if (!rendezvous) {
      rendezvous = tandem::dist::Rendezvous{};
      rendezvous->port = tandem::dist::pick_free_port();
    }
    tandem::dist::GroupOptions group_options;
    group_options.backend = "gloo";
    group_options.timeout = std::chrono::seconds(60);  // a peer that hangs ends the job
    auto group = std::make_shared<tandem::dist::ProcessGroup>(*rendezvous, group_options);
    const int64_t rank = group->rank(), world = group->size();
    TANDEM_CHECK_USAGE(global_batch % world == 0, "--global-batch ", global_batch, " is not a multiple of the ",
                       world, " processes");
    const int64_t batch = global_batch / world;  // each process's share

    auto data = example::regression_data();
    torch::manual_seed(rank);  // other weights on every rank: DDP must make them one
    torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
    tandem::parallel::DistributedDataParallel ddp(model.ptr(), group);  // rank 0's weights everywhere
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));

    tandem::data::DistributedSamplerOptions sampler_options;
    sampler_options.world_size = world;
    sampler_options.rank = rank;
    sampler_options.seed = 7;
    tandem::data::DistributedSampler sampler(data.x.size(0), sampler_options);

    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      auto mine = sampler.indices(epoch);  // this rank's share of the epoch's shuffle
      double loss_sum = 0;
      int64_t steps = 0;
      for (size_t start = 0; start + batch <= mine.size(); start += batch) {
        auto index = torch::tensor(std::vector<int64_t>(mine.begin() + start, mine.begin() + start + batch));
        ddp.zero_grad();
        ddp.before_forward();
        auto loss = torch::mse_loss(model->forward(data.x.index_select(0, index)), data.y.index_select(0, index));
        loss.backward();       // buckets are all-reduced while backward runs
        ddp.after_backward();  // the gradients are the average over the ranks now
        sgd.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      example::print_epoch_loss(*group, epoch + 1, loss_sum, steps);
    }

    example::print_rank_checksum(*group, *model);
    if (rank == 0 && !weights_out.empty()) torch::save(model->parameters(), weights_out);
    return 0;
  });
}
