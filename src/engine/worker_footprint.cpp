#include "tandem/engine/worker_footprint.h"

#include <malloc.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <sstream>
#include <thread>

#include <torch/torch.h>

#include "tandem/data/source.h"
#include "tandem/engine/run_setup.h"
#include "tandem/engine/task.h"
#include "tandem/engine/counting_allocator.h"
#include "tandem/engine/parallel_layout.h"

#include <c10/core/CPUAllocator.h>
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"

namespace tandem::engine {
namespace {

// A field of /proc/self/status in bytes ("RssAnon", "VmHWM", ...); 0 if absent.
int64_t status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, field.size() + 1, field + ":") != 0) continue;
    std::istringstream words(line.substr(field.size() + 1));
    int64_t kib = 0;
    words >> kib;
    return kib * 1024;
  }
  return 0;
}

std::string gib(int64_t bytes) { return format("%.2f GB", static_cast<double>(bytes) / 1e9); }

// A number from a cgroup v2 file of this process's group ("max" or absent: -1).
int64_t cgroup_value(const std::string& name) {
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  }
  std::ifstream in("/sys/fs/cgroup" + path + "/" + name);
  std::string text;
  if (!(in >> text) || text == "max") return -1;
  try {
    return std::stoll(text);
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace

WorkerFootprint measure_worker_footprint(const TrainOptions& o, int64_t workers) {
  WorkerFootprint f;
  f.base_bytes = status_bytes("RssAnon");
  // A pipeline over ranks: every stage reads its replica's whole share.
  const auto layout = parallel_layout(o, workers);
  const int64_t ranks = layout.pipeline ? layout.data_ranks() : workers;
  f.worker_batch = o.batch_per_process > 0 ? o.batch_per_process : std::max<int64_t>(1, o.batch_size / ranks);
  {
    const auto data_options = data_options_for(o);
    auto splits = data::open_data(o.data, data_options);
    if (!o.val_data.empty()) splits.test = data::open_eval_data(o.val_data, data_options, &splits);
    f.data_bytes = std::max<int64_t>(0, status_bytes("RssAnon") - f.base_bytes);

    const auto info = splits.train->info();
    // The model's tensors are counted as they are allocated: live bytes and
    // their peak, which the heap malloc keeps from before would hide.
    CountingCpuAllocator installed;
    auto& counting = installed.counting();
    check_model_fits(o, model_options_for(o, info), workers, machine_resources());
    auto model = models::make_seeded_model(o.model, model_options_for(o, info), o.seed);
    model->to(o.dtype == Dtype::kFloat64 ? torch::kFloat64 : torch::kFloat32);
    // The optimizer's state as the run's: SGD's momentum, or AdamW's two moments.
    std::unique_ptr<torch::optim::Optimizer> optimizer;
    if (resolved_optimizer(o) == Optimizer::kAdamW) {
      optimizer = std::make_unique<torch::optim::AdamW>(model->parameters(), torch::optim::AdamWOptions(o.lr));
    } else {
      optimizer = std::make_unique<torch::optim::SGD>(model->parameters(), torch::optim::SGDOptions(o.lr).momentum(o.momentum));
    }
    auto& sgd = *optimizer;
    const auto task = info.seq_len > 0 ? language_model_task() : classification_task();
    f.probe_batch = std::min({f.worker_batch, kProbeBatch, splits.train->size()});
    std::vector<int64_t> indices(static_cast<size_t>(f.probe_batch));
    std::iota(indices.begin(), indices.end(), 0);
    auto inputs = splits.train->get_batch(indices, 0);
    auto x = inputs.inputs.is_floating_point() ? inputs.inputs.to(models::parameter_dtype(*model)) : inputs.inputs;
    auto step = [&] {
      sgd.zero_grad();
      task->loss(model->forward(x), inputs.targets).backward();
      sgd.step();
    };
    model->train();
    step();  // gradients and momentum now exist: the state a worker keeps
    const int64_t state = counting.live();
    counting.reset_peak();
    step();
    const int64_t trained = counting.peak() - state;
    // Evaluation takes the same batches, without gradients (with
    // BatchNorm's statistics and no graph, a few models peak higher there).
    counting.reset_peak();
    {
      torch::NoGradGuard no_grad;
      model->eval();
      model->forward(x);
    }
    const int64_t evaluated = counting.peak() - state;
    f.state_bytes = state;
    const double probe = static_cast<double>(f.probe_batch);
    f.activation_bytes = static_cast<int64_t>(static_cast<double>(std::max(trained, evaluated)) / probe *
                                              static_cast<double>(f.worker_batch));
  }
  ::malloc_trim(0);  // the launcher keeps none of it while the workers run
  return f;
}

MachineResources machine_resources() {
  MachineResources r;
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      std::istringstream words(line.substr(13));
      int64_t kib = 0;
      words >> kib;
      r.available_bytes = kib * 1024;
    }
  }
  const int64_t limit = cgroup_value("memory.max"), used = cgroup_value("memory.current");
  if (limit > 0 && used >= 0) r.available_bytes = std::min(r.available_bytes, std::max<int64_t>(0, limit - used));
  r.cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  return r;
}

// Note [memory limit]: Linux grants memory on demand and, once it is
// gone, kills the process that asks for more (the OOM killer: SIGKILL, no
// message). A run of 8192 x 8192 images resized 256 at a time (268 MB
// each) ended that way. Capping the address space at what the process has
// mapped now plus the memory available makes an allocation past it fail
// in the allocator instead, which libtorch turns into an error naming the
// bytes, and the CLI into its out-of-memory advice. Set after the data are
// opened (token files are mapped whole, and their pages are not memory
// the run takes); a lower limit already set (ulimit -v) is kept.
void limit_memory_to_available() {
  struct rlimit current {};
  if (::getrlimit(RLIMIT_AS, &current) != 0) return;
  const auto limit = static_cast<rlim_t>(status_bytes("VmSize") + machine_resources().available_bytes);
  if (current.rlim_cur != RLIM_INFINITY && current.rlim_cur <= limit) return;
  struct rlimit next = current;
  next.rlim_cur = limit;
  if (current.rlim_max != RLIM_INFINITY && next.rlim_cur > current.rlim_max) next.rlim_cur = current.rlim_max;
  ::setrlimit(RLIMIT_AS, &next);
}

void check_model_fits(const TrainOptions& o, const models::ModelOptions& model_options, int64_t workers,
                      const MachineResources& machine) {
  const auto traits = models::model_traits(o.model);
  if (!traits.parameter_count || machine.available_bytes <= 0) return;
  const int64_t count = traits.parameter_count(model_options);
  const int64_t element = o.dtype == Dtype::kFloat64 ? 8 : 4;
  // Every rank builds the whole model before any parallelism cuts it.
  const double need = static_cast<double>(count) * static_cast<double>(element) * static_cast<double>(workers);
  TANDEM_CHECK_USAGE(need <= static_cast<double>(machine.available_bytes), "--model ", o.model, ": ",
                     format("%.3g", static_cast<double>(count)), " parameters need ", gib(static_cast<int64_t>(need)),
                     " for their weights alone (", workers > 1 ? std::to_string(workers) + " workers, " : "",
                     element, " bytes each), more than the ", gib(machine.available_bytes),
                     " of memory this machine has available");
}

std::vector<std::string> check_worker_resources(int64_t workers, const WorkerFootprint& f,
                                                const MachineResources& machine) {
  const int64_t need = workers * f.total();
  const std::string figures = format(
      "%lld workers x about %s each (measured in this process: %s for the program, %s for the data, %s for the "
      "model's weights, gradients and momentum, %s for the activations of a step at the worker's batch of %lld, "
      "scaled from %lld) = %s",
      static_cast<long long>(workers), gib(f.total()).c_str(), gib(f.base_bytes).c_str(),
      gib(f.data_bytes).c_str(), gib(f.state_bytes).c_str(), gib(f.activation_bytes).c_str(),
      static_cast<long long>(f.worker_batch), static_cast<long long>(f.probe_batch), gib(need).c_str());
  TANDEM_CHECK(need <= machine.available_bytes, "--nproc-per-node ", workers, ": ", figures,
               ", more than the ", gib(machine.available_bytes), " of memory this machine has available; start "
               "fewer workers, give a smaller --batch-size, or --skip-resource-check to start them anyway");
  std::vector<std::string> warnings;
  if (10 * need > 8 * machine.available_bytes) {
    warnings.push_back(format("--nproc-per-node %lld: %s, close to the %s of memory available",
                              static_cast<long long>(workers), figures.c_str(),
                              gib(machine.available_bytes).c_str()));
  }
  if (workers > machine.cores) {
    warnings.push_back(format("--nproc-per-node %lld: more CPU workers than the %lld cores; they share them, "
                              "one thread each, and %lld would train as fast or faster",
                              static_cast<long long>(workers), static_cast<long long>(machine.cores),
                              static_cast<long long>(machine.cores)));
  }
  return warnings;
}

}  // namespace tandem::engine
