// What a run is made of before any parallelism (run_setup.h): the job's
// process group, the data, the model from the factory.
#include "tandem/engine/run_setup.h"
#include "tandem/engine/worker_footprint.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "tandem/data/source.h"
#include "tandem/dist/rendezvous.h"
#include "tandem/parallel/data_parallel.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::engine {

std::optional<torch::ScalarType> autocast_dtype(AmpMode amp) {
  switch (amp) {
    case AmpMode::kBf16: return torch::kBFloat16;
    case AmpMode::kFp16: return torch::kHalf;
    case AmpMode::kOff: break;
  }
  return std::nullopt;
}

torch::Device parse_device(const std::string& text) {
  return parallel::parse_one_device(text, "--device", text, "cpu, cuda or cuda:N");
}

std::shared_ptr<dist::ProcessGroup> join_job(const TrainOptions& o, torch::Device& device) {
  auto rendezvous = dist::rendezvous_from_env();
  if (!rendezvous) return nullptr;
  dist::GroupOptions g;
  g.backend = option_name(o.dist_backend);
  g.device = o.device;
  g.timeout = std::chrono::milliseconds(static_cast<int64_t>(o.dist_timeout * 1000));
  // One GPU per local rank: a plain --device cuda means cuda:LOCAL_RANK.
  if (device.is_cuda() && !device.has_index()) {
    device = torch::Device(torch::kCUDA,
                           static_cast<c10::DeviceIndex>(rendezvous->local_rank % torch::cuda::device_count()));
  }
  if (device.is_cuda()) {  // NCCL and the caching allocator use the current device
    c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->setDevice(device);
    g.device = device.str();
  }
  return std::make_shared<dist::ProcessGroup>(*rendezvous, g);
}

data::DataOptions data_options_for(const TrainOptions& o) {
  data::DataOptions data_options;
  data_options.augment = o.augment;
  data_options.image_size = o.image_size;
  data_options.seed = o.seed;
  data_options.skip_bad_images = o.skip_bad_images;
  data_options.seq_len = resolved_seq_len(o);
  data_options.vocab_size = o.vocab_size;
  data_options.tokenizer = o.tokenizer;
  return data_options;
}

data::DataSplits open_run_data(const TrainOptions& o) {
  const auto data_options = data_options_for(o);
  auto splits = data::open_data(o.data, data_options);
  const bool tokens = data::is_token_spec(o.data);
  if (!o.val_data.empty()) {
    // What the spec alone shows is refused before the data are read.
    if (!tokens) data::check_same_label_kind(o.data, splits.train->info(), o.val_data, "--val-data ");
    TANDEM_CHECK_USAGE(!tokens || data::data_format(o.val_data) == data::data_format(o.data), "--val-data ",
                       o.val_data, ": ", data::data_format(o.val_data), " data, but --data ", o.data, " is ",
                       data::data_format(o.data), " data: the same numbers would name other tokens");
    splits.test = data::open_eval_data(o.val_data, data_options, &splits);
  }
  auto info = splits.train->info();
  auto test_info = splits.test ? splits.test->info() : info;
  if (tokens) {
    // The same kind of tokens: bytes are not token ids of a tokenizer, and
    // token files of another vocabulary (llm.c's GPT-2 against LLaMA 3
    // shards) number other tokens; scored by the model, either gave a
    // loss that meant nothing, with exit 0.
    TANDEM_CHECK(test_info.num_classes == info.num_classes, "--val-data ", o.val_data, ": tokens of a vocabulary of ",
                 test_info.num_classes, ", but --data ", o.data, "'s are of ", info.num_classes,
                 ": another tokenizer's tokens (--vocab-size sets one for both where the files do not say it)");
    return splits;
  }
  TANDEM_CHECK(info.channels == test_info.channels && info.height == test_info.height &&
                   info.width == test_info.width,
               "--val-data ", o.val_data, ": images are ", test_info.channels, "x", test_info.height, "x",
               test_info.width, " after transforms, but ", info.channels, "x", info.height, "x", info.width,
               " in --data ", o.data);
  data::check_same_classes(o.data, info, o.val_data.empty() ? o.data : o.val_data, test_info, "--val-data ");
  return splits;
}

models::ModelOptions model_options_for(const TrainOptions& o, const data::DatasetInfo& info) {
  models::ModelOptions options;
  options.in_channels = info.channels;
  options.num_classes = info.num_classes;  // the training data's (check_same_classes)
  options.image_size = info.height;
  options.width_mult = o.width_mult;
  options.stem = o.stem;
  options.vocab_size = info.seq_len > 0 ? info.num_classes : 0;
  options.seq_len = info.seq_len;
  options.dropout = o.dropout;
  return options;
}

models::Sequence build_model(const TrainOptions& o, const data::DatasetInfo& info,
                             const models::ModelOptions& options, const torch::Device& device) {
  models::Sequence model{nullptr};
  // Every worker on the machine builds one: too large for it is refused
  // before the first allocation (worker_footprint.h).
  if (device.is_cpu()) check_model_fits(o, options, 1, machine_resources());
  try {
    model = models::make_seeded_model(o.model, options, o.seed);  // Note [seeded model]
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    if (info.seq_len > 0) throw UsageError(detail::str_cat("--model ", o.model, ": ", e.what()));
    throw UsageError(detail::str_cat("--model ", o.model, ": ", e.what(), " (the images are ", info.height, " x ",
                                     info.width, o.image_size > 0 ? ", from --image-size" : "; --image-size resizes them",
                                     ")"));
  }
  model->to(device, o.dtype == Dtype::kFloat64 ? torch::kFloat64 : torch::kFloat32);
  return model;
}

void report_data_warnings(const data::DataSplits& data, std::FILE* to) {
  for (const auto* dataset : {data.train.get(), data.test.get()}) {
    if (dataset == nullptr) continue;
    for (const auto& line : dataset->drain_warnings()) {
      if (to) std::fprintf(to, "tandem: warning: %s\n", printable(line).c_str());
    }
  }
  if (to) std::fflush(to);
}

}  // namespace tandem::engine
