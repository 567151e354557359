// bench/train_throughput: training-step throughput of a tandem model.
//
// Each step gathers a batch (index_select + normalisation, as the trainer's
// IDX loader does), runs forward, cross-entropy, backward and an SGD step
// (momentum 0.9, weight decay 5e-4). Prints one JSON line per round so that
// bench/cpu_train.sh can interleave it with the PyTorch peer
// (bench/train_throughput.py), which does the same work.
//
//   train_throughput --model convnet --data fashion-mnist --batch 256 --steps 30 --rounds 3
//   train_throughput --model resnet18 --data random:3x32 --batch 256 ...
#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "bench_main.h"
#include "tandem/cli/flags.h"
#include "tandem/data/idx.h"
#include "tandem/data/source.h"
#include "tandem/engine/trainer.h"
#include "tandem/models/registry.h"
#include "tandem/util/allocator.h"
#include "tandem/util/parse.h"
#include "tandem/util/stopwatch.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does
  std::string model_name = "convnet", data_spec = "fashion-mnist", device_text = "cpu";
  int64_t batch = 256, steps = 30, warmup = 5, rounds = 3;
  cli::FlagSet flags("train_throughput", "Training-step throughput of one model.");
  flags.add_string("model", "NAME", &model_name, "model");
  flags.add_string("data", "SPEC", &data_spec, "fashion-mnist, idx:DIR or random:CxS");
  flags.add_string("device", "DEV", &device_text, "cpu or cuda");
  flags.add_int("batch", "N", &batch, "batch size", 1);
  flags.add_int("steps", "N", &steps, "timed steps per round", 1);
  flags.add_int("warmup", "N", &warmup, "untimed steps before the first round", 0);
  flags.add_int("rounds", "N", &rounds, "rounds (one JSON line each)", 1);
  return bench::run("train_throughput", flags, argc, argv, [&] {
    torch::manual_seed(0);
    auto device = engine::parse_device(device_text);

    // The data: real images (gathered per step) or one fixed random batch.
    std::shared_ptr<const data::Dataset> dataset;
    torch::Tensor fixed_inputs, fixed_targets;
    int64_t channels, size, classes = 10;
    if (data_spec.rfind("random:", 0) == 0) {
      auto parts = split(data_spec.substr(7), 'x');
      TANDEM_CHECK(parts.size() == 2 && parse_int(parts[0]) && parse_int(parts[1]),
                   "--data random:CxS expected, got ", data_spec);
      channels = *parse_int(parts[0]);
      size = *parse_int(parts[1]);
      fixed_inputs = torch::randn({batch, channels, size, size});
      fixed_targets = torch::randint(0, classes, {batch}, torch::kInt64);
    } else {
      dataset = data::open_data(data_spec).train;
      auto info = dataset->info();
      channels = info.channels;
      size = info.height;
      classes = info.num_classes;
    }
    models::ModelOptions o;
    o.in_channels = channels;
    o.image_size = size;
    o.num_classes = classes;
    auto model = models::make_model(model_name, o);
    model->to(device);
    model->train();
    torch::optim::SGD sgd(model->parameters(),
                          torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(5e-4));
    auto order = torch::randperm(dataset ? dataset->size() : batch, torch::kInt64);
    int64_t cursor = 0;
    auto step = [&] {
      torch::Tensor inputs, targets;
      if (dataset) {
        if (cursor + batch > order.size(0)) cursor = 0;
        auto slice = order.slice(0, cursor, cursor + batch);
        cursor += batch;
        auto b = dataset->get_batch({slice.data_ptr<int64_t>(), slice.data_ptr<int64_t>() + batch}, 0);
        inputs = b.inputs;
        targets = b.targets;
      } else {
        inputs = fixed_inputs;
        targets = fixed_targets;
      }
      inputs = inputs.to(device);
      targets = targets.to(device);
      sgd.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model->forward(inputs), targets);
      loss.backward();
      sgd.step();
      return loss;
    };
    for (int64_t i = 0; i < warmup; ++i) step();
    if (device.is_cuda()) torch::cuda::synchronize();
    for (int64_t r = 0; r < rounds; ++r) {
      Stopwatch clock;
      torch::Tensor loss;
      for (int64_t i = 0; i < steps; ++i) loss = step();
      loss.item<float>();  // waits for the device
      double seconds = clock.seconds();
      std::printf("{\"impl\": \"tandem\", \"model\": \"%s\", \"batch\": %lld, \"threads\": %d, "
                  "\"images_per_second\": %.1f}\n",
                  model_name.c_str(), static_cast<long long>(batch), at::get_num_threads(),
                  steps * batch / seconds);
      std::fflush(stdout);
    }
  });
}
