// A run's weights files: what an export's metadata records, and loading
// weights checked against it (run_setup.h).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/source.h"
#include "tandem/engine/run_setup.h"
#include "tandem/checkpoint/hf_format.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/parse.h"
#include "tandem/util/table.h"

namespace tandem::engine {

std::map<std::string, std::string> weights_metadata(const TrainOptions& o, const data::DataSplits& splits) {
  const auto info = splits.train->info();
  std::map<std::string, std::string> metadata{{"format", "pt"}, {"producer", "tandem"}, {"model", models::canonical_model_name(o.model)}};
  // A model built from a config.json is known by that config, not by its folder.
  if (o.model.rfind("hf:", 0) == 0) metadata["hf_config"] = checkpoint::model_config_json(o.model);
  if (info.seq_len > 0) {
    // A language model: its vocabulary shapes it; the data's kind and the
    // sequence length say how it was trained.
    for (const auto& [key, value] : shape_settings(o, splits)) metadata[key] = value;
    metadata["tokens"] = data::data_format(o.data);
    metadata["seq_len"] = std::to_string(info.seq_len);
    metadata["data"] = data::absolute_spec(o.data);
    if (!o.tokenizer.empty()) metadata["tokenizer"] = std::filesystem::absolute(o.tokenizer).string();
    return metadata;
  }
  metadata["num_classes"] = std::to_string(info.num_classes);
  if (!info.class_names.empty()) {
    metadata["classes"] = nlohmann::json(info.class_names).dump();
  } else {
    metadata["labels"] = data::data_format(o.data);
  }
  for (const auto& [key, value] : shape_settings(o, splits)) metadata[key] = value;
  metadata["normalize_mean"] = nlohmann::json(splits.mean).dump();
  metadata["normalize_std"] = nlohmann::json(splits.std).dump();
  // What `tandem eval` needs to evaluate as training did (Note [eval from
  // the weights] in src/cli/eval_command.cpp).
  metadata["data"] = data::absolute_spec(o.data);
  metadata["augment"] = o.augment.empty() ? splits.default_augment : o.augment;
  metadata["eval_transform"] = splits.eval_transform;
  return metadata;
}

std::map<std::string, std::string> shape_settings(const TrainOptions& o, const data::DataSplits& splits) {
  const auto info = splits.train->info();
  if (info.seq_len > 0) return {{"vocab_size", std::to_string(info.num_classes)}};
  std::map<std::string, std::string> settings{{"image_size", std::to_string(info.height)}};
  if (o.model == "mobilenetv2") settings["width_mult"] = format("%g", o.width_mult);
  if (o.model.rfind("resnet", 0) == 0) {
    models::ModelOptions model_options;
    model_options.image_size = info.height;
    model_options.stem = o.stem;
    settings["stem"] = models::resolved_stem(model_options);
  }
  return settings;
}

void load_run_weights(const TrainOptions& o, const data::DataSplits& splits, const checkpoint::SafetensorsFile& file,
                      const std::string& path, torch::nn::Module& model, const std::vector<std::string>& except) {
  try {
    checkpoint::load_weights(file, path, model, except);
  } catch (const UsageError&) {
    throw;  // a name in `except` that the model lacks: not the settings' doing
  } catch (const Error& e) {
    // Note [shape settings]: the model's tensors are shaped by settings
    // besides --model and the classes; a file's tensors that do not fit
    // were most likely made with other ones, which its metadata says
    // (exports since 2026-11-27). Named as the flags, after the tensor.
    auto described = [](const std::string& key, const std::string& value) {
      if (key == "image_size") return detail::str_cat(value, " x ", value, " images");
      if (key == "stem") return detail::str_cat("the ", value, " stem");
      if (key == "vocab_size") return detail::str_cat("a vocabulary of ", value, " tokens");
      return detail::str_cat("--width-mult ", value);
    };
    std::string hint;
    for (const auto& [key, value] : shape_settings(o, splits)) {
      auto it = file.metadata.find(key);
      if (it == file.metadata.end() || it->second == value) continue;
      const char* flag = key == "image_size" ? "--image-size"
                         : key == "stem"       ? "--stem"
                         : key == "vocab_size" ? "--vocab-size"
                                               : "--width-mult";
      hint += detail::str_cat("; ", flag, ": the weights were made for ", described(key, it->second),
                              " (their metadata), this run's model for ", described(key, value));
    }
    if (hint.empty()) throw;
    TANDEM_FAIL(e.what(), hint);
  }
}

void check_weights_metadata(const TrainOptions& o, const data::DataSplits& splits,
                            const std::map<std::string, std::string>& metadata, const std::string& path) {
  const auto info = splits.train->info();
  auto field = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  const auto* hf_config = field("hf_config");
  const bool hf = o.model.rfind("hf:", 0) == 0;
  const std::string config = hf ? checkpoint::model_config_json(o.model) : std::string();
  if (hf_config && hf) {
    TANDEM_CHECK(*hf_config == config, path, ": trained as ", field("model") ? *field("model") : std::string("?"),
                 " whose config.json said ", *hf_config, "; --model ", o.model, "'s config.json says ", config,
                 " (a config.json changed since, or weights of another model)");
  }
  if (const auto* model = field("model"); model && !(hf_config && hf)) {
    TANDEM_CHECK(*model == o.model || *model == models::canonical_model_name(o.model), path, ": weights of --model ", *model, " (its metadata), not of --model ",
                 o.model);
  }
  if (const auto* kind = field("tokens")) {
    TANDEM_CHECK(data::is_token_spec(o.data) && *kind == data::data_format(o.data), path, ": a model of ",
                 printable(*kind), " data (its metadata), but --data ", o.data, " is ",
                 data::data_format(o.data), " data: the same numbers name other tokens");
  }
  if (const auto* vocab = field("vocab_size")) {
    TANDEM_CHECK(*vocab == std::to_string(info.num_classes), path, ": a model of a vocabulary of ", printable(*vocab),
                 " tokens (its metadata), but --data ", o.data, " has ", info.num_classes, " (--vocab-size sets it)");
  }
  if (const auto* classes = field("classes")) {
    auto parsed = nlohmann::json::parse(*classes, nullptr, /*allow_exceptions=*/false);
    TANDEM_CHECK(parsed.is_array() && std::all_of(parsed.begin(), parsed.end(), [](const auto& c) { return c.is_string(); }),
                 path, ": its metadata's classes are not a list of names: ", *classes);
    const auto names = parsed.get<std::vector<std::string>>();
    TANDEM_CHECK(!info.class_names.empty(), path, ": trained on class folders (", data::class_list(names),
                 "), but --data ", o.data, " numbers its labels (", data::data_format(o.data),
                 " data): nothing says which number is which class");
    TANDEM_CHECK(names == info.class_names, path, ": trained on the classes ", data::class_list(names),
                 ", but --data ", o.data, " has the class folders ", data::class_list(info.class_names),
                 "; labels are class folder indices, so both need the same class folders");
  }
  if (const auto* labels = field("labels")) {
    TANDEM_CHECK(info.class_names.empty(), path, ": trained on numbered labels (", *labels, " data), but --data ",
                 o.data, " names its classes by folder (", data::class_list(info.class_names),
                 "): nothing says which folder is which number");
    TANDEM_CHECK(*labels == data::data_format(o.data), path, ": trained on ", *labels, " labels, but --data ",
                 o.data, " is ", data::data_format(o.data), " data: the same numbers name other classes");
  }
  if (const auto* count = field("num_classes")) {
    const auto parsed = parse_int(*count);
    TANDEM_CHECK(parsed && *parsed >= 1, path, ": its metadata's num_classes '", printable(*count),
                 "' is not a number of classes");
    TANDEM_CHECK(*parsed == info.num_classes, path, ": trained for ", *count, " classes, but --data ",
                 o.data, " has ", info.num_classes);
  }
  // Note [normalisation in exports]: the inputs are normalised with --data's
  // statistics (IDX: its training images' own mean and standard deviation),
  // so evaluating IDX weights with another --data, whose files have other
  // statistics, gave a lower accuracy with nothing said: Fashion-MNIST's
  // weights with MNIST as --data and Fashion-MNIST as --val-data were fed
  // inputs normalised with MNIST's mean and std (about 0.131 and 0.308)
  // instead of Fashion-MNIST's (about 0.286 and 0.353). Exports since 2026-11-27
  // record the statistics; a difference beyond rounding is refused here,
  // and so is a file with one of the two. Files with neither (older
  // exports, other programs) are taken as they are, with a warning from
  // tandem eval. --init-weights does not check: fine-tuning on other data is
  // what it is for.
  const auto* mean = field("normalize_mean");
  const auto* std = field("normalize_std");
  TANDEM_CHECK((mean == nullptr) == (std == nullptr), path, ": its metadata has ",
               mean ? "normalize_mean but no normalize_std" : "normalize_std but no normalize_mean",
               "; tandem train --export-weights writes both (a damaged or edited file?)");
  if (mean != nullptr && std != nullptr) {
    auto numbers = [&](const std::string& text) {
      auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
      TANDEM_CHECK(parsed.is_array() && !parsed.empty() &&
                       std::all_of(parsed.begin(), parsed.end(), [](const auto& v) { return v.is_number(); }),
                   path, ": its metadata's normalize_mean and normalize_std are not lists of numbers: ", *mean,
                   " and ", *std);
      return parsed.template get<std::vector<double>>();
    };
    const auto trained_mean = numbers(*mean), trained_std = numbers(*std);
    auto near = [](const std::vector<double>& a, const std::vector<double>& b) {
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        // Exports write the numbers to the last digit; allow only rounding.
        if (std::abs(a[i] - b[i]) > 1e-7 * std::max(std::abs(a[i]), std::abs(b[i]))) return false;
      }
      return true;
    };
    auto listed = [](const std::vector<double>& values) {
      std::string text;
      for (double v : values) text += (text.empty() ? "" : ", ") + format("%.8g", v);
      return "[" + text + "]";
    };
    TANDEM_CHECK(near(trained_mean, splits.mean) && near(trained_std, splits.std), path,
                 ": trained on inputs normalised with mean ", listed(trained_mean), " and std ", listed(trained_std),
                 " (its metadata), but --data ", o.data, " normalises with mean ", listed(splits.mean),
                 " and std ", listed(splits.std),
                 "; give as --data the data set the weights were trained on (images to evaluate on go in --val-data)");
  }
}

}  // namespace tandem::engine
