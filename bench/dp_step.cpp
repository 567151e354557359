// bench/dp_step: DataParallel's cost per training step on repeated CPU
// devices, against one device, in one process (configurations interleaved
// step by step, so the machine's drift hits them alike).
//
// A step: zero_grad, forward, cross-entropy, backward, SGD. Configurations:
//   plain-1   the model alone, 1 compute thread
//   dp-cpu    DataParallel over one device (cpu): scatter, refresh of the
//             kept replica, gather and gradient hooks with nothing to run in
//             parallel, 1 thread: DataParallel's own overhead
//   plain-2   the model alone, 2 compute threads (intra-op parallelism)
//   dp-cpu2   DataParallel over cpu,cpu, one replica thread each running its
//             ops on 1 thread: the same 2 cores used by replicas (but
//             backward on CPU runs on the one thread that called it)
//   dp-cpu2-t2  the same with 2 compute threads (as `tandem train` runs it)
//   torch-dp2 libtorch's torch::nn::parallel::data_parallel over cpu,cpu (it
//             deep-clones the module every call), when it accepts CPU devices
// Prints one JSON line with the median step time of each and the ratios
// dp-cpu / plain-1 (overhead), and dp-cpu2 and dp-cpu2-t2 over plain-2.
//
// With --device cuda (a GPU; the clock stops after a device synchronize):
//   plain     the model alone on cuda:0
//   dp-1      DataParallel over cuda:0 (its own overhead)
//   dp-2      DataParallel over cuda:0,cuda:0 (two replicas sharing the GPU)
//   torch-dp2 libtorch's data_parallel over cuda:0,cuda:0 (clones per call)
// and the ratios dp-1 / plain - 1, dp-2 / plain and torch-dp2 / dp-2.
//
//   dp_step --model convnet --image-size 28 --channels 1 --batch 256 [--device cuda]
#include <cstdio>
#include <functional>
#include <map>
#include <vector>

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/nn/parallel/data_parallel.h>
#include <torch/torch.h>

#include "bench_main.h"
#include "tandem/util/cuda_module.h"
#include "tandem/cli/flags.h"
#include "tandem/models/registry.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/allocator.h"
#include "tandem/util/check.h"
#include "tandem/util/stats.h"
#include "tandem/util/stopwatch.h"
#include "tandem/util/table.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string model_name = "convnet", device_name = "cpu";
  int64_t batch = 256, size = 28, channels = 1, steps = 10, warmup = 2;
  cli::FlagSet flags("dp_step", "DataParallel on repeated CPU devices against one device.");
  flags.add_string("model", "NAME", &model_name, "model");
  flags.add_int("batch", "N", &batch, "batch", 2);
  flags.add_int("image-size", "N", &size, "random CxNxN inputs", 4);
  flags.add_int("channels", "C", &channels, "input channels", 1);
  flags.add_int("steps", "N", &steps, "timed steps per configuration", 1);
  flags.add_int("warmup", "N", &warmup, "untimed rounds first", 0);
  flags.add_choice("device", &device_name, {"cpu", "cuda"}, "repeated cpu devices, or cuda:0 twice");
  return bench::run("dp_step", flags, argc, argv, [&] {
    models::ModelOptions o;
    o.in_channels = channels;
    o.image_size = size;
    o.num_classes = 10;
    torch::manual_seed(0);
    const bool cuda = parallel::parse_one_device(device_name, "--device", device_name, "cpu or cuda").is_cuda();
    const torch::Device cpu(torch::kCPU), gpu(torch::kCUDA, 0);
    const torch::Device home = cuda ? gpu : cpu;
    auto inputs = torch::randn({batch, channels, size, size}).to(home);
    auto targets = torch::randint(0, 10, {batch}, torch::kInt64).to(home);

    struct Config {
      std::string name;
      int threads;
      models::Sequence model{nullptr};
      std::function<torch::Tensor(const torch::Tensor&)> forward;
      std::unique_ptr<torch::optim::SGD> sgd;
      std::vector<double> ms;
      std::string error;
    };
    std::vector<std::unique_ptr<Config>> configs;
    auto add = [&](std::string name, int threads) {
      auto c = std::make_unique<Config>();
      c->name = std::move(name);
      c->threads = threads;
      torch::manual_seed(0);
      c->model = models::make_model(model_name, o);
      c->model->to(home);
      c->sgd = std::make_unique<torch::optim::SGD>(c->model->parameters(),
                                                   torch::optim::SGDOptions(0.01).momentum(0.9));
      configs.push_back(std::move(c));
      return configs.back().get();
    };
    // Kept alive for the whole run (the configurations' forwards hold them).
    std::vector<parallel::DataParallel> kept;
    auto add_dp = [&](std::string name, int threads, std::vector<torch::Device> devices) {
      auto* c = add(std::move(name), threads);
      kept.emplace_back(c->model, parallel::DataParallelOptions{std::move(devices)});
      c->forward = [dp = kept.back()](const torch::Tensor& x) mutable { return dp->forward(x); };
    };
    auto add_torch_dp = [&](std::vector<torch::Device> devices) {
      auto* c = add("torch-dp2", 1);
      c->forward = [m = c->model, devices](const torch::Tensor& x) mutable {
        return torch::nn::parallel::data_parallel(m, x, devices);
      };
    };
    auto add_plain = [&](std::string name, int threads) {
      auto* c = add(std::move(name), threads);
      c->forward = [m = c->model](const torch::Tensor& x) mutable { return m->forward(x); };
    };
    if (cuda) {
      add_plain("plain", 1);
      add_dp("dp-1", 1, {gpu});
      add_dp("dp-2", 1, {gpu, gpu});
      add_torch_dp({gpu, gpu});
    } else {
      add_plain("plain-1", 1);
      add_dp("dp-cpu", 1, {cpu});
      add_plain("plain-2", 2);
      add_dp("dp-cpu2", 1, {cpu, cpu});
      add_dp("dp-cpu2-t2", 2, {cpu, cpu});
      add_torch_dp({cpu, cpu});
    }

    for (int64_t round = 0; round < warmup + steps; ++round) {
      for (auto& c : configs) {
        if (!c->error.empty()) continue;
        at::set_num_threads(c->threads);
        try {
          Stopwatch clock;
          c->sgd->zero_grad();
          auto loss = torch::nn::functional::cross_entropy(c->forward(inputs), targets);
          loss.backward();
          c->sgd->step();
          if (cuda) torch::cuda::synchronize();
          if (round >= warmup) c->ms.push_back(1e3 * clock.seconds());
        } catch (const std::exception& e) {
          c->error = e.what();
          c->error = c->error.substr(0, c->error.find('\n'));
        }
      }
    }
    std::map<std::string, double> ms;
    std::string fields;
    for (auto& c : configs) {
      ms[c->name] = median(c->ms);
      fields += c->error.empty() ? format("\"%s_ms\": %.2f, ", c->name.c_str(), ms[c->name])
                                 : format("\"%s_error\": \"%s\", ", c->name.c_str(), c->error.c_str());
    }
    if (cuda) {
      std::printf("{\"model\": \"%s\", \"batch\": %lld, \"device\": \"cuda\", %s\"dp_overhead\": %.4f, "
                  "\"dp2_vs_plain\": %.3f, \"torchdp2_vs_dp2\": %.3f}\n",
                  model_name.c_str(), static_cast<long long>(batch), fields.c_str(),
                  ms["dp-1"] / ms["plain"] - 1, ms["dp-2"] / ms["plain"],
                  ms.count("torch-dp2") && ms["torch-dp2"] > 0 ? ms["torch-dp2"] / ms["dp-2"] : 0.0);
      return;
    }
    std::printf("{\"model\": \"%s\", \"batch\": %lld, %s\"dp_overhead\": %.4f, \"dp2_vs_plain2\": %.3f, \"dp2t2_vs_plain2\": %.3f}\n",
                model_name.c_str(), static_cast<long long>(batch), fields.c_str(),
                ms["dp-cpu"] / ms["plain-1"] - 1, ms["dp-cpu2"] / ms["plain-2"], ms["dp-cpu2-t2"] / ms["plain-2"]);
  });
}
