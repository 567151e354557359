// tandem eval: trained weights (a safetensors file) evaluated on a data set.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>

#include "common_flags.h"
#include "weights_defaults.h"
#include "tandem/checkpoint/hf_format.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/data/source.h"
#include "tandem/engine/divergence.h"
#include "tandem/engine/evaluate.h"
#include "tandem/engine/run_setup.h"
#include "tandem/observe/metrics.h"
#include "tandem/optim/amp.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

// The model and the data are described as for `tandem train` (the same
// flags build the same model); the defaults are TrainOptions'.
FlagSet eval_flags(engine::TrainOptions& o, std::string& weights) {
  FlagSet flags("tandem eval",
                "Evaluate trained weights (the file tandem train --export-weights writes) on the "
                "test split of --data, or on --val-data: loss and accuracy. The model, --data, "
                "--augment, --image-size, --stem and --width-mult default to what the weights' "
                "metadata records of their training run, so that the evaluation is the run's own "
                "(a flag given wins, with a warning where it differs). Inputs are normalised as in "
                "training; weights whose metadata records other statistics or classes than the "
                "data's are refused. Under tandem launch or torchrun the ranks share the data.");
  flags.section("weights");
  flags.add_string("weights", "PATH", &weights,
                   "safetensors file holding every parameter and buffer of --model, or the folder --export-hf "
                   "wrote (required)");
  add_data_flags(flags, o);
  add_model_flags(flags, o);
  flags.section("run");
  flags.add_string("device", "DEV", &o.device, "cpu, cuda or cuda:N");
  flags.add_int("batch-size", "N", &o.batch_size, "evaluation batch size over all processes", 1);
  return flags;
}

}  // namespace

std::string eval_help() {
  engine::TrainOptions defaults;
  std::string weights;
  return eval_flags(defaults, weights).help();
}

int eval_command(const std::vector<std::string>& args) {
  engine::TrainOptions options;
  std::string weights;
  auto flags = eval_flags(options, weights);
  flags.parse(args);
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  if (weights.empty()) throw UsageError("--weights FILE is required (what tandem train --export-weights wrote)");
  check_given_flags(options, flags);  // a usage mistake is named before any file is read
  auto file = checkpoint::read_weights_or_folder(weights);  // an --export-weights file or an --export-hf folder
  const auto from = defaults_from_weights(file.metadata, weights, flags, options);
  // An image folder has no test split of its own: the command line alone
  // says there is nothing to evaluate (it failed only after the set-up, exit 1).
  if (options.val_data.empty() && data::data_format(options.data) == "imagefolder") {
    throw UsageError("--data " + options.data + ": an image folder has no test split; give the images to "
                     "evaluate on as --val-data imagefolder:DIR");
  }
  // The model as training built it (its classes and input size from the
  // data), from the factory: no optimizer, strategy or checkpoints. Under
  // a launcher the ranks evaluate shares of the data and sum them.
  engine::check_train_options(options);
  auto device = engine::parse_device(options.device);
  const auto group = engine::join_job(options, device);
  const int64_t rank = group ? group->rank() : 0;
  const auto data = engine::open_run_data(options);
  TANDEM_CHECK(data.test, "no evaluation data for ", options.data, " (give --val-data)");
  engine::check_weights_metadata(options, data, file.metadata, weights);  // the model and classes it was trained for
  if (auto it = file.metadata.find("eval_transform"); rank == 0 && it != file.metadata.end() &&
                                                      !from.augment_or_size_given && it->second != data.eval_transform) {
    std::fprintf(stderr, "tandem: warning: %s: evaluated with %s, but its run evaluated with %s (its metadata)\n",
                 printable(weights).c_str(), printable(data.eval_transform).c_str(), printable(it->second).c_str());
  }
  const bool language = data::is_token_spec(options.data);
  if (rank == 0 && !language && file.metadata.count("normalize_mean") == 0) {
    // Exports before 2026-11-27, or another program's file (Note [normalisation in exports]).
    std::fprintf(stderr,
                 "tandem: warning: %s: its metadata does not say how the inputs were normalised in training; "
                 "they are normalised as --data %s's are, which is right only if the weights were trained on it\n",
                 weights.c_str(), options.data.c_str());
  }
  const auto info = data.train->info();
  auto model = engine::build_model(options, info, engine::model_options_for(options, info), device);
  std::error_code ec;
  if (std::filesystem::is_directory(weights, ec)) {
    checkpoint::load_hf_weights(weights, model, options.model, info.num_classes);
  } else {
    engine::load_run_weights(options, data, file, weights, *model);
  }
  if (options.channels_last) models::to_channels_last(*model);
  if (options.cudnn_benchmark) at::globalContext().setBenchmarkCuDNN(true);
  const auto amp = engine::autocast_dtype(options.amp);
  engine::Forward forward;
  if (amp || options.channels_last) {
    forward = [&](const torch::Tensor& x) {
      optim::AutocastGuard autocast(device.type(), amp);
      const bool nhwc = options.channels_last && x.dim() == 4;
      return model->forward(nhwc ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x);
    };
  }
  const auto task = language ? engine::language_model_task() : engine::classification_task();
  auto result = engine::evaluate(model, *data.test, options.batch_size, device, options.workers, group.get(), forward,
                                 task.get());
  engine::report_data_warnings(data, stderr);  // images --skip-bad-images left out, every rank its own
  // Weights that give no finite loss are no result (Note [diverged]).
  if (!std::isfinite(result.loss)) {
    std::vector<std::pair<std::string, torch::Tensor>> named;
    for (const auto& p : model->named_parameters()) named.emplace_back(p.key(), p.value());
    for (const auto& b : model->named_buffers()) named.emplace_back(b.key(), b.value());
    auto [largest, where] = engine::largest_magnitude(named);
    throw Error(format("%s: these weights give a test loss of %s on %s (their largest value in magnitude: %g, in "
                       "'%s'): the weights of a run that diverged?",
                       weights.c_str(), std::isnan(result.loss) ? "NaN" : "inf",
                       options.val_data.empty() ? options.data.c_str() : options.val_data.c_str(), largest,
                       where.c_str()));
  }
  if (rank == 0 && language) {
    const bool text = data::data_format(options.data) == "text" && options.tokenizer.empty();  // bytes as tokens
    std::printf("%s from %s on %s: test loss %.4f nats/token (perplexity %.2f%s), next-token accuracy %.2f%% "
                "(%lld windows of %lld tokens)\n",
                options.model.c_str(), weights.c_str(),
                options.val_data.empty() ? options.data.c_str() : options.val_data.c_str(), result.loss,
                observe::perplexity(result.loss),
                text ? format(", %.3f bits per byte", observe::bits_per_byte(result.loss)).c_str() : "",
                100 * result.accuracy, static_cast<long long>(result.count), static_cast<long long>(info.seq_len));
  } else if (rank == 0) {
    std::printf("%s from %s on %s: test loss %.4f, test accuracy %.2f%% (%lld image%s)\n",
                options.model.c_str(), weights.c_str(),
                options.val_data.empty() ? options.data.c_str() : options.val_data.c_str(), result.loss,
                100 * result.accuracy, static_cast<long long>(result.count), result.count == 1 ? "" : "s");
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace tandem::cli
