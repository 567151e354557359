// examples/ddp/main.cpp: a training loop of one's own with tandem's
// DistributedDataParallel, the C++ counterpart of PyTorch's DDP tutorial
// (seed 002's recipe, on a small regression so that it runs in seconds).
//
//   tandem launch --nproc-per-node 2 -- ./ddp_example    # 2 processes
//   torchrun --nproc-per-node 2 ./ddp_example            # the same, torchrun's way
//   ./ddp_example                                        # one process
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
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <tandem/tandem.h>

namespace {

struct Options {
  int64_t epochs = 8;
  int64_t global_batch = 64;
  double lr = 0.05;
  std::string weights_out;  // rank 0 saves the final parameters there (torch::save)
};

int64_t positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || value <= 0) {
    throw tandem::UsageError(flag + ": expected a positive integer, got '" + text + "'");
  }
  return value;
}

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "--help") {
      std::printf("usage: ddp_example [--epochs N (8)] [--global-batch B (64)] [--weights-out FILE]\n");
      std::exit(0);
    }
    if (i + 1 >= argc) throw tandem::UsageError(flag + ": expected a value, or an unknown flag");
    std::string value = argv[++i];
    if (flag == "--epochs") {
      options.epochs = positive(flag, value);
    } else if (flag == "--global-batch") {
      options.global_batch = positive(flag, value);
    } else if (flag == "--weights-out") {
      options.weights_out = value;
    } else {
      throw tandem::UsageError("unknown flag '" + flag + "' (--epochs, --global-batch, --weights-out)");
    }
  }
  return options;
}

// 1024 points of y = sin(x . w) + 0.05 noise, x in R^8: the same on every
// rank, since every rank seeds alike.
struct Data {
  torch::Tensor x, y;
};

Data make_data() {
  torch::manual_seed(1234);
  auto x = torch::randn({1024, 8});
  auto w = torch::randn({8, 1}) / 3;
  return {x, torch::sin(x.mm(w)) + 0.05 * torch::randn({1024, 1})};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options options = parse(argc, argv);

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
    TANDEM_CHECK_USAGE(options.global_batch % world == 0, "--global-batch ", options.global_batch,
                       " is not a multiple of the ", world, " processes");
    const int64_t batch = options.global_batch / world;  // each process's share

    Data data = make_data();
    torch::manual_seed(rank);  // different weights on every rank: DDP must make them one
    torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(), torch::nn::Linear(32, 1));
    tandem::parallel::DistributedDataParallel ddp(model.ptr(), group);  // rank 0's weights everywhere
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(options.lr).momentum(0.9));

    tandem::data::DistributedSamplerOptions sampler_options;
    sampler_options.world_size = world;
    sampler_options.rank = rank;
    sampler_options.seed = 7;
    tandem::data::DistributedSampler sampler(data.x.size(0), sampler_options);

    for (int64_t epoch = 0; epoch < options.epochs; ++epoch) {
      auto mine = sampler.indices(epoch);  // this rank's share of the epoch's shuffle
      double loss_sum = 0;
      int64_t steps = 0;
      for (size_t start = 0; start + batch <= mine.size(); start += batch) {
        auto index = torch::tensor(std::vector<int64_t>(mine.begin() + start, mine.begin() + start + batch));
        ddp.zero_grad();
        ddp.before_forward();
        auto loss = torch::mse_loss(model->forward(data.x.index_select(0, index)), data.y.index_select(0, index));
        loss.backward();     // buckets are all-reduced while backward runs
        ddp.after_backward();  // the gradients are the average over the ranks now
        sgd.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      auto mean = torch::tensor({loss_sum / steps}, torch::kFloat64);
      group->all_reduce(mean, tandem::dist::ReduceOp::kAvg).wait();
      if (rank == 0) std::printf("epoch %lld: loss %.6f\n", static_cast<long long>(epoch + 1), mean.item<double>());
    }

    double sum = 0, squares = 0;
    for (const auto& p : model->parameters()) {
      sum += p.sum().item<double>();
      squares += p.square().sum().item<double>();
    }
    std::printf("rank %lld of %lld: weights sum %.9g, sum of squares %.9g\n", static_cast<long long>(rank),
                static_cast<long long>(world), sum, squares);
    if (rank == 0 && !options.weights_out.empty()) torch::save(model->parameters(), options.weights_out);
    return 0;
  } catch (const tandem::UsageError& e) {
    std::fprintf(stderr, "ddp_example: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_example: error: %s\n", e.what());
    return 1;
  }
}
