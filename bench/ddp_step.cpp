// bench/ddp_step: the time of one data-parallel training step, per rank.
//
// Every rank trains a tandem model on one fixed random batch of
// global / world images (the data pipeline is not what is measured here):
// zero_grad, forward, cross-entropy, backward, gradient reduction, SGD step.
// Run it under `tandem launch` (or alone for one rank without a group).
// Rank 0 prints one JSON line: the median step time over the timed steps and
// the median share of all-reduce time hidden behind backward (DdpTimeline).
// bench/ddp.sh compares it with bench/ddp_step.py (PyTorch DDP) in one run.
//
//   tandem launch --nproc-per-node 2 -- ddp_step --mode ddp --model resnet18 --batch 64
//   ddp_step --mode none --batch 64                        (one process, no DDP)
//   tandem launch --nproc-per-node 2 -- ddp_step --mode fsdp --batch 64   (bench/fsdp.sh)
//   tandem launch --nproc-per-node 2 -- ddp_step --mode scaling --batch 64
//
// --mode scaling measures (a), the scaling efficiency, with the drift
// between processes cancelled (Note [paired scaling]).
//
// Note [paired scaling]: on a shared machine the same one-process step
// moves by 10 to 25% from one process to the next, more than the two
// implementations' efficiencies differ, so t(1 process) / (W t(W ranks))
// from separate processes says little. In this mode the W ranks alternate
// one DDP step at global / W images each with one plain step of a second,
// un-wrapped copy of the model on the whole global batch, run by rank 0
// alone while the others wait in a barrier (their cores idle, as a
// one-process run leaves them). Each pair's ratio is one efficiency
// measured within seconds, and the median over pairs is printed.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include "bench_main.h"
#include "counting_allocator.h"
#include "tandem/util/cuda_module.h"
#include "tandem/cli/flags.h"
#include "tandem/dist/collectives.h"
#include "tandem/dist/process_group.h"
#include "tandem/models/registry.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/ddp.h"
#include "tandem/parallel/fsdp.h"
#include "tandem/util/allocator.h"
#include "tandem/util/check.h"
#include "tandem/util/stats.h"
#include "tandem/util/stopwatch.h"

using namespace tandem;

int main(int argc, char** argv) {
  tune_malloc_for_training();  // as the tandem binary does
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  std::string model_name = "resnet18", mode = "ddp", hook = "allreduce", zero = "optimizer";
  std::string fsdp_sharding = "full";
  int64_t batch = 64, size = 32, steps = 8, warmup = 2, threads = 1;
  int64_t fsdp_min_unit_params = int64_t(1) << 17;
  double bucket_cap_mb = 25, last_bucket_mb = 1;
  bool timeline = false, shard_optimizer = false, count_memory = false;
  cli::FlagSet flags("ddp_step", "Time of one data-parallel training step.");
  flags.add_string("model", "NAME", &model_name, "model (CIFAR stem at 32 px)");
  flags.add_choice("mode", &mode, {"none", "ddp", "allreduce", "paired", "scaling", "fsdp"},
                   "none: no gradient reduction (one rank); ddp: DistributedDataParallel; "
                   "fsdp: FullyShardedDataParallel (bench/fsdp.sh); "
                   "allreduce: average_gradients after backward; paired: one process "
                   "alternating steps of a plain model and of the same model under DDP in a "
                   "group of one (DDP's own overhead, machine drift cancelled); scaling: the "
                   "ranks alternate DDP steps with a plain step on the whole batch on rank 0 "
                   "(scaling efficiency, drift cancelled)");
  flags.add_choice("zero", &zero, {"optimizer", "ddp"},
                   "how DDP's gradients are cleared: the optimizer's zero_grad (set to undefined, "
                   "as the trainer does on CPU) or ddp.zero_grad (in place)");
  flags.add_switch("shard-optimizer", &shard_optimizer,
                   "step with optim::ZeroSgd (momentum sharded over the ranks, each share "
                   "broadcast by its owner) instead of torch::optim::SGD; bench/zero.sh");
  flags.add_choice("fsdp-sharding", &fsdp_sharding, {"full", "grad-op"},
                   "--mode fsdp: ZeRO-3 (parameters gathered again for backward) or ZeRO-2");
  flags.add_int("fsdp-min-unit-params", "N", &fsdp_min_unit_params,
                "--mode fsdp: the smallest unit of top-level layers (parallel::plan_units)", 0);
  flags.add_switch("count-memory", &count_memory,
                   "count the CPU allocator's live bytes and report their peak over the timed "
                   "steps (peak_live_mib; rank 0's process)");
  flags.add_choice("comm-hook", &hook, {"allreduce", "fp16", "bf16"}, "DDP communication hook");
  flags.add_double("bucket-cap-mb", "MB", &bucket_cap_mb, "DDP bucket cap", 1e-3);
  flags.add_switch("timeline", &timeline, "print each timed DDP step's buckets: size, launch and end, in "
                 "ms from the end of backward (every rank, stderr)");
  flags.add_double("last-bucket-mb", "MB", &last_bucket_mb,
                   "DDP's last bucket (Note [small last bucket]; 0: none, PyTorch's plan)", 0);
  flags.add_int("batch", "N", &batch, "global batch", 1);
  flags.add_int("image-size", "N", &size, "random 3xNxN inputs", 4);
  flags.add_int("steps", "N", &steps, "timed steps", 1);
  flags.add_int("warmup", "N", &warmup, "untimed steps first", 0);
  flags.add_int("threads", "N", &threads, "compute threads per rank", 1);
  return bench::run("ddp_step", flags, argc, argv, [&] {
    at::set_num_threads(static_cast<int>(threads));
    std::shared_ptr<dist::ProcessGroup> group;
    if (auto rv = dist::rendezvous_from_env()) group = std::make_shared<dist::ProcessGroup>(*rv);
    int64_t world = group ? group->size() : 1, rank = group ? group->rank() : 0;
    TANDEM_CHECK((mode != "none" && mode != "paired") || world == 1, "--mode ", mode,
                 " runs one rank, not ", world);
    if (mode == "paired") {
      dist::Rendezvous alone;
      alone.port = dist::pick_free_port();
      group = std::make_shared<dist::ProcessGroup>(alone);
    }
    TANDEM_CHECK(mode == "none" || group, "--mode ", mode, " needs a group: run under tandem launch");
    TANDEM_CHECK(mode != "scaling" || world >= 2, "--mode scaling needs at least 2 ranks, got ", world);
    TANDEM_CHECK(batch % world == 0, "--batch ", batch, " is not divisible by ", world, " ranks");

    models::ModelOptions o;
    o.in_channels = 3;
    o.image_size = size;
    o.num_classes = 10;
    torch::manual_seed(1 + rank);
    auto inputs = torch::randn({batch / world, 3, size, size});
    auto targets = torch::randint(0, 10, {batch / world}, torch::kInt64);
    // --mode scaling: rank 0's whole batch for the plain step.
    torch::Tensor all_inputs, all_targets;
    if (mode == "scaling" && rank == 0) {
      all_inputs = torch::randn({batch, 3, size, size});
      all_targets = torch::randint(0, 10, {batch}, torch::kInt64);
    }
    struct Run {
      models::Sequence model{nullptr};
      std::unique_ptr<parallel::DistributedDataParallel> ddp;
      std::unique_ptr<parallel::FullyShardedDataParallel> fsdp;
      std::unique_ptr<torch::optim::SGD> sgd;
      std::vector<double> step_ms, hidden, exposed_ms, optimizer_ms;
    };
    auto make_run = [&](bool use_ddp) {
      auto run = std::make_unique<Run>();
      torch::manual_seed(0);
      run->model = models::make_model(model_name, o);
      run->model->train();
      if (use_ddp) {
        parallel::DdpOptions options;
        options.buckets.bucket_bytes = static_cast<int64_t>(bucket_cap_mb * (1 << 20));
        options.buckets.last_bucket_bytes = static_cast<int64_t>(last_bucket_mb * (1 << 20));
        options.comm_hook = parallel::make_comm_hook(hook);
        run->ddp = std::make_unique<parallel::DistributedDataParallel>(run->model.ptr(), group, options);
      } else if (group && mode == "allreduce") {
        dist::broadcast_module(*run->model, *group);
      }
      const auto sgd_options = torch::optim::SGDOptions(0.01).momentum(0.9).weight_decay(5e-4);
      if (mode == "fsdp") {
        parallel::FsdpOptions options;
        options.min_unit_numel = fsdp_min_unit_params;
        options.reshard_after_forward = fsdp_sharding == "full";
        run->fsdp = std::make_unique<parallel::FullyShardedDataParallel>(run->model, group, options);
        run->sgd = std::make_unique<torch::optim::SGD>(run->fsdp->parameters(), sgd_options);
      } else if (shard_optimizer && group && (use_ddp || mode == "allreduce")) {
        run->sgd = std::make_unique<optim::ZeroSgd>(run->model->parameters(), sgd_options, group);
      } else {
        run->sgd = std::make_unique<torch::optim::SGD>(run->model->parameters(), sgd_options);
      }
      return run;
    };
    auto step = [&](Run& r, bool timed, bool whole_batch = false) {
      Stopwatch clock;
      if (r.ddp) {
        if (zero == "optimizer") {
          r.sgd->zero_grad();  // undefined: backward's fresh gradient is copied into the bucket
        } else {
          r.ddp->zero_grad();  // in place: backward accumulates into the bucket
        }
        r.ddp->before_forward();
      } else {
        r.sgd->zero_grad();
        if (group && mode == "allreduce") dist::broadcast_buffers(*r.model, *group);
      }
      auto forward = [&](const torch::Tensor& x) { return r.fsdp ? r.fsdp->forward(x) : r.model->forward(x); };
      auto loss = whole_batch ? torch::nn::functional::cross_entropy(forward(all_inputs), all_targets)
                              : torch::nn::functional::cross_entropy(forward(inputs), targets);
      loss.backward();
      if (r.fsdp) {
        r.fsdp->after_backward();
      } else if (r.ddp) {
        r.ddp->after_backward();
      } else if (group && mode == "allreduce") {
        dist::average_gradients(*r.model, *group);
      }
      Stopwatch optimizer_clock;
      r.sgd->step();
      if (!timed) return;
      r.optimizer_ms.push_back(optimizer_clock.seconds() * 1e3);
      r.step_ms.push_back(clock.seconds() * 1e3);
      if (r.ddp) {
        const auto& t = r.ddp->last_timeline();
        r.hidden.push_back(parallel::hidden_share(t));
        auto last = *std::max_element(t.finished.begin(), t.finished.end());
        r.exposed_ms.push_back(
            std::max(0.0, std::chrono::duration<double, std::milli>(last - t.backward_end).count()));
        if (timeline) {
          auto ms = [&](auto when) {
            return std::chrono::duration<double, std::milli>(when - t.backward_end).count();
          };
          std::fprintf(stderr, "step %zu, ms from the end of backward:", r.step_ms.size());
          for (size_t b = 0; b < t.launched.size(); ++b) {
            std::fprintf(stderr, " [bucket %zu, %.1f MiB: %.1f to %.1f]", b,
                         r.ddp->buckets()[b].bytes / 1048576.0, ms(t.launched[b]), ms(t.finished[b]));
          }
          std::fprintf(stderr, "\n");
        }
      }
    };
    TANDEM_CHECK(mode != "fsdp" || group, "--mode fsdp needs a group: run under tandem launch");
    // --count-memory: every allocation from here on goes through the counter.
    auto* base_allocator = c10::GetCPUAllocator();
    std::unique_ptr<testing::CountingAllocator> counting;
    if (count_memory) {
      counting = std::make_unique<testing::CountingAllocator>(base_allocator);
      c10::SetCPUAllocator(counting.get(), /*priority=*/100);
    }
    auto main_run = make_run(mode == "ddp" || mode == "paired" || mode == "scaling");
    std::unique_ptr<Run> plain;
    if (mode == "paired" || (mode == "scaling" && rank == 0)) plain = make_run(false);
    if (mode == "scaling") {  // Note [paired scaling]
      for (int64_t i = 0; i < warmup + steps; ++i) {
        group->barrier().wait();
        step(*main_run, i >= warmup);
        group->barrier().wait();
        if (plain) step(*plain, i >= warmup, /*whole_batch=*/true);
      }
      group->barrier().wait();
      if (rank != 0) return;
      std::vector<double> efficiency;
      for (size_t i = 0; i < main_run->step_ms.size(); ++i) {
        efficiency.push_back(plain->step_ms[i] / (static_cast<double>(world) * main_run->step_ms[i]));
      }
      std::printf("{\"impl\": \"tandem\", \"mode\": \"scaling\", \"world\": %lld, \"batch\": %lld, "
                  "\"threads\": %d, \"plain_ms\": %.2f, \"step_ms\": %.2f, \"efficiency\": %.4f}\n",
                  static_cast<long long>(world), static_cast<long long>(batch), at::get_num_threads(),
                  median(plain->step_ms), median(main_run->step_ms), median(efficiency));
      std::fflush(stdout);
      return;
    }
    for (int64_t i = 0; i < warmup + steps; ++i) {
      if (counting && i == warmup) counting->reset_peak();
      step(*main_run, i >= warmup);
      if (plain) step(*plain, i >= warmup);
    }
    const double peak_live_mib = counting ? static_cast<double>(counting->peak()) / 1048576.0 : 0.0;
    auto& ddp = main_run->ddp;
    auto& step_ms = main_run->step_ms;
    auto& hidden = main_run->hidden;
    auto& exposed_ms = main_run->exposed_ms;
    if (plain && rank == 0) {
      std::vector<double> ratios;
      for (size_t i = 0; i < step_ms.size(); ++i) ratios.push_back(step_ms[i] / plain->step_ms[i]);
      std::printf("{\"impl\": \"tandem\", \"mode\": \"paired\", \"batch\": %lld, \"threads\": %d, "
                  "\"plain_ms\": %.2f, \"ddp_ms\": %.2f, \"ratio\": %.4f}\n",
                  static_cast<long long>(batch), at::get_num_threads(), median(plain->step_ms),
                  median(step_ms), median(ratios));
      return;
    }
    // This rank's momentum buffers (a sharded optimizer holds its share).
    double state_bytes = 0;
    for (const auto& [key, state] : main_run->sgd->state()) {
      const auto& buffer = static_cast<const torch::optim::SGDParamState&>(*state).momentum_buffer();
      if (buffer.defined()) state_bytes += static_cast<double>(buffer.numel() * buffer.element_size());
    }
    // What the rank holds between steps for training: the parameters the
    // optimizer steps (FSDP: the shards), their gradients, the momentum.
    double held_bytes = state_bytes;
    for (const auto& g : main_run->sgd->param_groups()) {
      for (const auto& p : g.params()) {
        held_bytes += static_cast<double>(p.numel() * p.element_size());
        if (p.grad().defined()) held_bytes += static_cast<double>(p.grad().numel() * p.grad().element_size());
      }
    }
    struct rusage usage {};
    getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB on Linux
    if (rank == 0) {
      std::printf("{\"impl\": \"tandem\", \"mode\": \"%s\", \"world\": %lld, \"batch\": %lld, "
                  "\"threads\": %d, \"buckets\": %zu, \"step_ms\": %.2f, \"hidden_share\": %.3f, "
                  "\"exposed_ms\": %.2f, \"optimizer_ms\": %.2f, \"state_mib\": %.2f, "
                  "\"held_mib\": %.2f, \"max_rss_mib\": %.1f, \"peak_live_mib\": %.1f}\n",
                  mode.c_str(), static_cast<long long>(world), static_cast<long long>(batch),
                  at::get_num_threads(), ddp ? ddp->buckets().size() : size_t(0), median(step_ms),
                  ddp ? median(hidden) : 0.0, ddp ? median(exposed_ms) : 0.0, median(main_run->optimizer_ms),
                  state_bytes / 1048576.0, held_bytes / 1048576.0, usage.ru_maxrss / 1024.0, peak_live_mib);
      std::fflush(stdout);
    }
  });
}
