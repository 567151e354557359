// examples/data_parallel.cpp: DataParallel in one process (seeds 000 and 003).
//
//   ./data_parallel --devices cpu,cpu,cpu      # a repeated device works too
//   ./data_parallel --devices cuda:0,cuda:1
//   ./data_parallel --epochs 1 --trace 1       # each replica's shapes, as DataParallel's classic example prints them
//
// Only the model's middle block runs under DataParallel, as a model may wrap
// only block2: each forward splits the batch over the devices, runs a replica
// of the block on each (made once, kept across steps), and gathers the
// outputs on the first device; backward sums the replicas' gradients into
// the block's own parameters. A copy of the model trained without
// DataParallel on the same batches is the reference: the program prints how
// far the two ended apart and fails above 1e-5 (relative).
#include <cstdio>

#include "example.h"

namespace {

tandem::models::Sequence block(int64_t in, int64_t out) {
  tandem::models::Sequence s;
  s->push_back("linear", torch::nn::Linear(in, out));
  s->push_back("tanh", torch::nn::Tanh());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  return example::run("data_parallel", [&] {
    std::string device_list = "cpu,cpu", trace = "0";
    int64_t epochs = 4;
    tandem::cli::FlagSet flags("data_parallel", "DataParallel over devices, one block of the model (seeds 000, 003)");
    flags.add_string("devices", "LIST", &device_list, "the replicas' devices, e.g. cpu,cpu or cuda:0,cuda:1");
    flags.add_int("epochs", "N", &epochs, "epochs to train", 1);
    flags.add_choice("trace", &trace, {"0", "1"}, "1: print each replica's input and output shapes");
    if (!example::parse_flags(flags, argc, argv)) return 0;
    const auto devices = tandem::parallel::parse_devices(device_list);

    auto data = example::regression_data();
    torch::manual_seed(0);
    tandem::models::Sequence plain;  // the reference, on the first device alone
    plain->push_back("block1", block(8, 32));
    plain->push_back("block2", block(32, 32));
    plain->push_back("head", torch::nn::Linear(32, 1));

    tandem::parallel::DataParallelOptions options;
    options.devices = devices;
    options.trace = trace == "1";
    tandem::models::Sequence model;
    model->push_back("block1", block(8, 32));
    model->push_back("block2", tandem::parallel::DataParallel(block(32, 32), options));  // "block2.module.linear.weight", ...
    model->push_back("head", torch::nn::Linear(32, 1));
    example::copy_weights(*plain, *model);
    plain->to(devices[0]);
    model->to(devices[0]);

    torch::optim::SGD sgd_plain(plain->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    auto x = data.x.to(devices[0]), y = data.y.to(devices[0]);
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      double loss_sum = 0;
      int64_t steps = 0;
      for (int64_t start = 0; start < x.size(0); start += 64) {
        auto xb = x.narrow(0, start, 64), yb = y.narrow(0, start, 64);
        sgd.zero_grad();
        auto loss = torch::mse_loss(model->forward(xb), yb);  // block2's rows split over the devices
        loss.backward();  // the replicas' gradients summed into block2's parameters
        sgd.step();
        sgd_plain.zero_grad();
        torch::mse_loss(plain->forward(xb), yb).backward();
        sgd_plain.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      std::printf("epoch %lld: loss %.6f\n", static_cast<long long>(epoch + 1), loss_sum / steps);
    }

    double difference = example::relative_difference(*plain, *model);
    std::printf("block2 over %zu devices (%s): %s; largest difference from the model without DataParallel: %.3g\n",
                devices.size(), device_list.c_str(), example::checksum(*model).c_str(), difference);
    TANDEM_CHECK(difference <= 1e-5, "DataParallel's weights differ from one device's by ", difference,
                 " (relative), more than 1e-5");
    return 0;
  });
}
