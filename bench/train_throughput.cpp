// bench/train_throughput: training-step throughput of a tandem model.
//
// Each step gathers a batch (index_select + normalisation, as the trainer's
// IDX loader does), runs forward, cross-entropy, backward and an SGD step
// (momentum 0.9, weight decay 5e-4; optim::Sgd, foreach kernels as PyTorch's
// default on CUDA). Prints one JSON line per round so that bench/cpu_train.sh
// and scripts/gpu-check can interleave it with the PyTorch peer
// (bench/train_throughput.py), which does the same work. With random data
// the one fixed batch lives on the device (no copy per step, on either side).
//
//   train_throughput --model convnet --data fashion-mnist --batch 256 --steps 30 --rounds 3
//   train_throughput --model resnet18 --data random:3x32 --batch 256 --device cuda \
//       [--amp bf16] [--channels-last] [--cudnn-benchmark] [--cuda-graph] [--ddp]
// --ddp wraps the model in DistributedDataParallel over the group that the
// environment describes (run it under `tandem launch --nproc-per-node 1`).
#include <cstdio>

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "bench_main.h"
#include "tandem/util/cuda_module.h"
#include "tandem/cli/flags.h"
#include "tandem/data/idx.h"
#include "tandem/data/source.h"
#include "tandem/dist/rendezvous.h"
#include "tandem/engine/cuda_graph.h"
#include "tandem/engine/trainer.h"
#include "tandem/models/activation_checkpoint.h"
#include "tandem/models/registry.h"
#include "tandem/optim/amp.h"
#include "tandem/optim/sgd.h"
#include "tandem/parallel/ddp.h"
#include "tandem/util/allocator.h"
#include "tandem/util/parse.h"
#include "tandem/util/stopwatch.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string model_name = "convnet", data_spec = "fashion-mnist", device_text = "cpu";
  int64_t batch = 256, steps = 30, warmup = 5, rounds = 3, checkpoint_segments = 0;
  std::string amp = "off";
  bool channels_last = false, cudnn_benchmark = false, cuda_graph = false, use_ddp = false;
  cli::FlagSet flags("train_throughput", "Training-step throughput of one model.");
  flags.add_string("model", "NAME", &model_name, "model");
  flags.add_string("data", "SPEC", &data_spec, "fashion-mnist, idx:DIR or random:CxS");
  flags.add_string("device", "DEV", &device_text, "cpu or cuda");
  flags.add_int("batch", "N", &batch, "batch size", 1);
  flags.add_int("steps", "N", &steps, "timed steps per round", 1);
  flags.add_int("warmup", "N", &warmup, "untimed steps before the first round", 0);
  flags.add_int("rounds", "N", &rounds, "rounds (one JSON line each)", 1);
  flags.add_choice("amp", &amp, {"off", "bf16"}, "autocast forward and loss to bf16");
  flags.add_switch("channels-last", &channels_last, "NHWC weights and inputs");
  flags.add_int("checkpoint-activations", "N", &checkpoint_segments,
                "the model's top-level layers in N segments, all but the last recomputed in "
                "backward (models/activation_checkpoint.h; 0: off)", 0);
  flags.add_switch("cudnn-benchmark", &cudnn_benchmark,
                   "cuDNN times its convolution algorithms per shape (torch.backends.cudnn.benchmark)");
  flags.add_switch("cuda-graph", &cuda_graph, "replay the step as a CUDA graph (engine/cuda_graph.h)");
  flags.add_switch("ddp", &use_ddp, "DistributedDataParallel over the group in the environment");
  return bench::run("train_throughput", flags, argc, argv, [&] {
    torch::manual_seed(0);
    auto device = engine::parse_device(device_text);
    TANDEM_CHECK(!cudnn_benchmark || device.is_cuda(), "--cudnn-benchmark needs --device cuda");
    if (cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);

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
    if (channels_last) models::to_channels_last(*model);
    if (checkpoint_segments > 0) {
      model->checkpoint_segments(models::plan_segments(static_cast<int64_t>(model->size()), checkpoint_segments));
    }
    auto format = channels_last ? torch::MemoryFormat::ChannelsLast : torch::MemoryFormat::Contiguous;
    if (fixed_inputs.defined()) {
      fixed_inputs = fixed_inputs.to(device).contiguous(format);
      fixed_targets = fixed_targets.to(device);
    }
    std::shared_ptr<dist::ProcessGroup> group;
    std::unique_ptr<parallel::DistributedDataParallel> ddp;
    if (use_ddp) {
      auto rendezvous = dist::rendezvous_from_env();
      TANDEM_CHECK(rendezvous, "--ddp: no RANK/WORLD_SIZE in the environment (run under tandem launch)");
      dist::GroupOptions g;
      g.device = device.str();
      group = std::make_shared<dist::ProcessGroup>(*rendezvous, g);
      ddp = std::make_unique<parallel::DistributedDataParallel>(model.ptr(), group);
    }
    auto amp_dtype = optim::parse_amp(amp);
    optim::Sgd sgd(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(5e-4));
    auto train_step = [&](const torch::Tensor& inputs, const torch::Tensor& targets) {
      if (ddp) {
        ddp->zero_grad();
        ddp->before_forward();
      } else {
        sgd.zero_grad();
      }
      engine::StepOutputs out;
      {
        optim::AutocastGuard autocast(device.type(), amp_dtype);
        out.logits = model->forward(inputs);
        out.loss = torch::nn::functional::cross_entropy(out.logits, targets);
      }
      out.loss.backward();
      if (ddp) ddp->after_backward();
      sgd.step();
      return out;
    };
    std::unique_ptr<engine::CudaGraphStep> graphed;
    if (cuda_graph) {
      TANDEM_CHECK(!ddp, "--cuda-graph and --ddp do not go together");
      graphed = std::make_unique<engine::CudaGraphStep>(device, train_step, engine::capture_options_for(sgd));
    }
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
      inputs = inputs.to(device).contiguous(format);
      targets = targets.to(device);
      return (graphed ? graphed->run(inputs, targets) : train_step(inputs, targets)).loss;
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
                  "\"amp\": \"%s\", \"channels_last\": %s, \"cudnn_benchmark\": %s, \"cuda_graph\": %s, \"ddp\": %s, "
                  "\"images_per_second\": %.1f}\n",
                  model_name.c_str(), static_cast<long long>(batch), at::get_num_threads(), amp.c_str(),
                  channels_last ? "true" : "false", cudnn_benchmark ? "true" : "false",
                  cuda_graph ? "true" : "false", ddp ? "true" : "false",
                  steps * batch / seconds);
      std::fflush(stdout);
    }
  });
}
