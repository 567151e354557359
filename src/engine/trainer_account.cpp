// The run's account of itself before its first step (Trainer::announce):
// the layout, what each flag came to, and the flags that had no effect.
#include "tandem/engine/trainer.h"

#include <algorithm>

#include "tandem/engine/device_peak.h"
#include "tandem/models/registry.h"
#include "tandem/optim/zero.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/table.h"

namespace tandem::engine {

void Trainer::announce(int64_t steps_per_epoch, const optim::ShardedState* zero) const {
  const auto& o = options_;
  if (!data_.test) warn("no evaluation data for " + o.data + " (give --val-data): evaluation skipped");
  if (mesh_.groups.mesh) {
    const std::string split =
        layout_.tensor_ranks() > 1
            ? format(", its layers split over %lld tp ranks", static_cast<long long>(layout_.tensor_ranks()))
            : std::string();
    say(format("device mesh %s over %lld ranks: %lld pipeline(s) of %lld stages, each stage replicated over "
               "its %lld dp ranks (Note [replicated stages])%s",
               layout_.mesh.str().c_str(), static_cast<long long>(job_world_),
               static_cast<long long>(layout_.data_ranks()), static_cast<long long>(layout_.pipeline_ranks()),
               static_cast<long long>(layout_.data_ranks()), split.c_str()));
  }
  if (world_ > 1) {
    say(format("data parallel over %lld ranks (%s, %s): batch %lld per rank, %lld in all",
               static_cast<long long>(world_), plan_->name().c_str(),
               mesh_.groups.data->backend().c_str(), static_cast<long long>(o.batch_size / world_),
               static_cast<long long>(o.batch_size)));
  }
  for (const auto& line : plan_->describe()) say(line);
  if (o.strategy == Strategy::kFsdp && !plan_->sharded()) {
    warn("--strategy fsdp in one process: nothing to shard over, training as one process does");
  }
  if (!mesh_.groups.data && !mesh_.groups.pipeline) {
    // One process, started without a launcher: the flags that act over
    // ranks have none (a sweep found them accepted without a word).
    const TrainOptions defaults;
    std::vector<std::string> idle;
    if (o.strategy == Strategy::kDdp || o.strategy == Strategy::kAllReduce) {
      idle.push_back("--strategy " + strategy_name(o.strategy));
    }
    if (o.shard_optimizer) idle.push_back("--shard-optimizer");
    if (o.sync_bn) idle.push_back("--sync-bn");
    if (o.ddp_comm_hook != defaults.ddp_comm_hook) idle.push_back("--ddp-comm-hook " + option_name(o.ddp_comm_hook));
    if (o.bucket_cap_mb != defaults.bucket_cap_mb) idle.push_back(format("--bucket-cap-mb %g", o.bucket_cap_mb));
    if (o.dist_backend != defaults.dist_backend) idle.push_back("--dist-backend " + option_name(o.dist_backend));
    if (o.dist_timeout != defaults.dist_timeout) idle.push_back(format("--dist-timeout %g", o.dist_timeout));
    if (!idle.empty()) {
      std::string flags;
      for (const auto& flag : idle) flags += (flags.empty() ? "" : ", ") + flag;
      warn(flags + ": one process, no ranks to act over; training as one process does (--nproc-per-node N "
                   "starts N)");
    }
  }
  // Counted when they were converted: FSDP's parameters hold no elements
  // by now.
  if (o.channels_last && channels_last_weights_ == 0) {
    warn("--channels-last: " + o.model + " has no 4-D weights (no convolutions); nothing changes");
  }
  if (o.batch_size > data_.train->size()) {
    warn(format("--batch-size %lld is more than the %lld training images: each step takes all of them",
                static_cast<long long>(o.batch_size), static_cast<long long>(data_.train->size())));
  }
  if (o.grad_accum > 1) {
    say(format("gradient accumulation: each rank's batch of %lld in %lld chunks, one optimizer step",
               static_cast<long long>(o.batch_size / world_), static_cast<long long>(o.grad_accum)));
  }
  if (o.clip_grad_norm > 0) say(format("gradients clipped to a global 2-norm of %g", o.clip_grad_norm));
  if (o.checkpoint_activations > 0 && layout_.pipeline) {
    say("activation checkpointing: every stage keeps only its micro-batches' inputs and recomputes "
        "its forward before their backward (GPipe's re-materialization)");
  } else if (o.checkpoint_activations > 0 && plan_->sharded()) {
    say("activation checkpointing: every FSDP unit but the last keeps only its input and recomputes "
        "its forward in backward (the unit is gathered for its backward anyway)");
  } else if (o.checkpoint_activations > 0 && o.strategy == Strategy::kFsdp) {
    warn("activation checkpointing: --strategy fsdp recomputes its units, and one process has none: off");
  } else if (o.checkpoint_activations > 0) {
    std::string sizes;
    for (auto n : model_->checkpointed_segments()) sizes += (sizes.empty() ? "" : ", ") + std::to_string(n);
    say(format("activation checkpointing: the top-level layers in segments of %s; all but the last "
               "recomputed in backward", sizes.c_str()));
  }
  if (zero) {
    auto shares = zero->shard_numels();
    int64_t whole = 0;
    for (auto n : shares) whole += n;
    // Bytes of state an element: SGD's momentum (none without it), AdamW's two moments.
    const bool adamw = resolved_optimizer(o) == Optimizer::kAdamW;
    const double bytes = static_cast<double>(torch::elementSize(models::parameter_dtype(*model_))) *
                         (adamw ? 2.0 : o.momentum > 0 ? 1.0 : 0.0);
    say(format("optimizer state sharded over %lld rank(s) (ZeRO-1): %s of %.2f to %.2f MiB a rank "
               "instead of %.2f", static_cast<long long>(shares.size()), adamw ? "AdamW's moments" : "momentum",
               *std::min_element(shares.begin(), shares.end()) * bytes / (1 << 20),
               *std::max_element(shares.begin(), shares.end()) * bytes / (1 << 20), whole * bytes / (1 << 20)));
  }
  if (amp_) {
    say(amp_ == torch::kHalf
            ? "mixed precision: fp16 autocast with dynamic loss scaling (initial scale 65536)"
            : "mixed precision: bf16 autocast");
  }
  // Interleaved: " (2 chunks per rank: rank r runs stages r, r + 2, ...)".
  auto chunks_note = [&](const char* holder, int64_t holders) {
    if (virtual_stages() <= 1) return std::string();
    return format(" (%lld chunks per %s: %s %c runs stages %c, %c + %lld, ...)",
                  static_cast<long long>(virtual_stages()), holder, holder, holder[0], holder[0], holder[0],
                  static_cast<long long>(holders));
  };
  if (layout_.pipeline && mesh_.groups.pipeline) {
    say(format("pipeline over %lld ranks, one stage per rank on its device (rank 0: %s): stages %s; "
               "%lld micro-batches, %s schedule%s",
               static_cast<long long>(mesh_.groups.pipeline->size()), device_.str().c_str(), pipeline_split_.c_str(),
               static_cast<long long>(o.micro_batches), option_name(o.schedule).c_str(),
               chunks_note("rank", mesh_.groups.pipeline->size()).c_str()));
  }
  if (layout_.pipeline && !mesh_.groups.pipeline) {
    const auto devices = parallel::parse_devices(o.devices);
    std::string names;
    for (const auto& d : devices) names += (names.empty() ? "" : ",") + d.str();
    say(format("pipeline over %s in one process: stages %s; %lld micro-batches, %s schedule%s",
               names.c_str(), pipeline_split_.c_str(), static_cast<long long>(o.micro_batches),
               option_name(o.schedule).c_str(),
               chunks_note("device", static_cast<int64_t>(devices.size())).c_str()));
  }
  if (tokens_per_sample_ > 0) {
    const double peak = peak_flops();
    say(format("language model: windows of %lld tokens, %lld tokens a step; %s optimizer; %s",
               static_cast<long long>(tokens_per_sample_), static_cast<long long>(o.batch_size * tokens_per_sample_),
               option_name(resolved_optimizer(o)).c_str(),
               peak > 0 ? format("MFU against %.4g TFLOPS over the job's devices", peak / 1e12).c_str()
                        : "no MFU (the device's peak is unknown: --peak-tflops X gives it)"));
  }
  say(format("training %s (%lld parameters) on %s, %lld steps/epoch, device %s",
             o.model.c_str(), static_cast<long long>(parameter_count_),
             data_.train->describe().c_str(), static_cast<long long>(steps_per_epoch),
             device_.str().c_str()));
}

// Note [peak for MFU]: MFU is the model's FLOPs a second (6 per weight and
// token, plus attention's) over the peak of every device the job runs on.
// The peak is --peak-tflops for each device, or on CUDA the dense bf16
// tensor-core peak of the ones whose figure is published (H100 and H200
// SXM: 989 TFLOPS), as nanoGPT and llm.c count MFU whatever the dtype; on
// other devices, and on the CPU, there is no MFU unless the flag gives it.
double Trainer::peak_flops() const {
  const auto& o = options_;
  double per_device = o.peak_tflops * 1e12;
  if (per_device == 0 && device_.is_cuda()) per_device = known_peak_flops(device_);
  if (per_device == 0) return 0;
  int64_t devices = job_world_;  // processes, a device each
  if (o.strategy == Strategy::kDp || (layout_.pipeline && !o.devices.empty())) {
    devices = static_cast<int64_t>(parallel::parse_devices(o.devices).size());
  }
  return per_device * static_cast<double>(devices);
}

}  // namespace tandem::engine
