#include "weights_defaults.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "tandem/data/source.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/parse.h"
#include "tandem/util/table.h"

namespace tandem::cli {

void check_given_flags(const engine::TrainOptions& options, const FlagSet& flags) {
  auto given = options;
  // The flags given are checked as a run of the kind they imply; the
  // metadata fills in the rest later.
  const bool tokens_given = (flags.given("data") && data::is_token_spec(options.data)) ||
                            (flags.given("val-data") && data::is_token_spec(options.val_data));
  if (!flags.given("model")) {
    if (flags.given("stem")) given.model = "resnet18";
    if (flags.given("width-mult")) given.model = "mobilenetv2";
    if (flags.given("seq-len") || flags.given("vocab-size") || tokens_given) {
      // A stand-in language model: the sequence length it takes is the
      // weights' model's to say, after their metadata is read.
      given.model = "gpt2-tiny";
      given.seq_len = std::min<int64_t>(given.seq_len, models::model_traits(given.model).context_length);
    }
  }
  const auto names = models::model_names();
  const bool known = std::find(names.begin(), names.end(), given.model) != names.end();
  if (!flags.given("data") && known && models::is_language_model(given.model)) {
    // A stand-in of the kind --val-data is, or text (the spec is only parsed here).
    given.data = flags.given("val-data") && data::is_token_spec(options.val_data) ? options.val_data : "text:-";
  }
  engine::check_train_options(given);
}

// Note [eval from the weights]: an export records what evaluation needs
// besides the tensors (engine::Trainer::weights_metadata): the model, the
// data it was trained on (the folder made absolute), the --augment preset
// and the settings that shape the inputs and the model (image_size, stem,
// width_mult), and the evaluation transform those made. Each flag not
// given takes the metadata's value, so `tandem eval --weights W` (or with
// --val-data D) evaluates as the run's own evaluation did and gives its
// accuracy; a flag given wins, with a warning where it differs. A model
// given other than the metadata's is refused later, by the metadata check,
// so the settings of the metadata's model are not applied to it. The
// evaluation transform built is compared with the recorded one.
FromWeights defaults_from_weights(const std::map<std::string, std::string>& metadata, const std::string& path,
                                  const FlagSet& flags, engine::TrainOptions& o) {
  const std::string file = printable(path);
  auto field = [&](const char* key) -> const std::string* {
    auto it = metadata.find(key);
    return it == metadata.end() ? nullptr : &it->second;
  };
  auto warn_differs = [&](const char* flag, const std::string& given, const std::string& recorded) {
    std::fprintf(stderr, "tandem: warning: --%s %s: %s was trained with --%s %s (its metadata); evaluating with "
                 "the --%s given\n", flag, printable(given).c_str(), file.c_str(), flag, printable(recorded).c_str(),
                 flag);
  };
  auto bad = [&](const char* key, const std::string& value, const std::string& why) -> Error {
    return Error(file + ": its metadata's " + key + " '" + printable(value) + "' " + why);
  };
  const auto* model = field("model");
  if (model && !flags.given("model")) o.model = *model;
  // A model built from a config.json, exported as a transformers folder:
  // the folder's own config.json says the same (the weights' hf_config
  // checks it), so the folder it was first built from may be gone.
  std::error_code ec;
  if ((model == nullptr || model->rfind("hf:", 0) == 0) && !flags.given("model") &&
      std::filesystem::is_directory(path, ec) && std::filesystem::exists(path + "/config.json", ec)) {
    o.model = "hf:" + path;  // and a folder save_pretrained wrote: the model its config.json describes
  }
  // Another model given is the command line's mistake, named before the
  // settings that follow from it (a --vocab-size the metadata's model had
  // and the one given has not).
  if (model && flags.given("model") && o.model != *model && models::canonical_model_name(o.model) != *model) {
    throw UsageError("--model " + o.model + ": " + file + " holds the weights of " + printable(*model) +
                     " (its metadata); leave --model out to evaluate them as that");
  }
  if (model && flags.given("model")) o.model = *model;  // the same model, as recorded
  const bool metadata_model = model && (o.model == *model || o.model.rfind("hf:", 0) == 0);  // the settings below are that model's
  if (const auto* data = field("data")) {
    if (flags.given("data")) {
      std::string given = o.data;
      try {
        given = data::absolute_spec(o.data);
      } catch (const std::exception&) {
      }
      if (given != *data) warn_differs("data", o.data, *data);
    } else {
      o.data = *data;
      std::string kind;
      try {
        kind = data::data_format(*data);
      } catch (const std::exception& e) {
        throw bad("data", *data, "is not a data spec tandem reads (" + std::string(e.what()) + ")");
      }
      const auto colon = data->find(':');
      const std::string folder = colon == std::string::npos ? "" : data->substr(colon + 1);
      if (kind == "text" || kind == "tokens") {
        // A language model's text or token files, evaluated on their held-out
        // part; when they are not here, --val-data's tokens stand in (the
        // vocabulary is the metadata's, and checked).
        try {
          data::check_spec_folder(*data);
        } catch (const std::exception& e) {
          if (o.val_data.empty() || !data::is_token_spec(o.val_data)) {
            throw Error(file + ": trained on --data " + printable(*data) + " (its metadata), which is not here (" +
                        e.what() + "); give --data, or --val-data text:FILE or tokens:PATH to evaluate on");
          }
          o.data = o.val_data;
        }
      } else if (!folder.empty() && path_kind(folder) != "a folder") {
        // An image folder's classes and statistics are in the metadata (and
        // checked): the evaluation folder stands in for a training folder
        // that is not on this machine.
        const bool images = kind == "imagefolder";
        if (images && !o.val_data.empty() && data::data_format(o.val_data) == "imagefolder") {
          o.data = o.val_data;
        } else {
          throw Error(file + ": trained on --data " + printable(*data) + " (its metadata), which is " +
                      path_kind(folder) + " here; give --data: the training data" +
                      (images ? ", or --val-data imagefolder:DIR" : " (its statistics normalise the inputs)"));
        }
      }
    }
  }
  if (const auto* tokenizer = field("tokenizer"); tokenizer && metadata_model && !flags.given("tokenizer")) {
    o.tokenizer = *tokenizer;  // the run's (Note [encode without specials])
  }
  if (const auto* vocab = field("vocab_size"); vocab && metadata_model && !flags.given("vocab-size")) {
    const auto recorded = parse_int(*vocab);
    if (!recorded || *recorded < 1) throw bad("vocab_size", *vocab, "is not a vocabulary size");
    o.vocab_size = *recorded;  // nanoGPT's .bin files need it; the others say theirs, checked against it
  }
  if (const auto* seq_len = field("seq_len"); seq_len && metadata_model) {
    const auto recorded = parse_int(*seq_len);
    if (!recorded || *recorded < 1) throw bad("seq_len", *seq_len, "is not a number of tokens");
    if (!flags.given("seq-len")) {
      o.seq_len = *recorded;
    } else if (o.seq_len != *recorded) {
      warn_differs("seq-len", std::to_string(o.seq_len), *seq_len);
    }
  }
  if (const auto* augment = field("augment")) {
    if (!flags.given("augment")) {
      o.augment = *augment;
    } else if (o.augment != *augment) {
      warn_differs("augment", o.augment, *augment);
    }
  }
  if (const auto* size = field("image_size")) {
    const auto recorded = parse_int(*size);
    if (!recorded) throw bad("image_size", *size, "is not a whole number of pixels");
    if (!flags.given("image-size")) {
      o.image_size = *recorded;
    } else if (o.image_size != *recorded) {
      warn_differs("image-size", std::to_string(o.image_size), *size);
    }
  }
  if (const auto* stem = field("stem"); stem && metadata_model) {
    if (!flags.given("stem")) {
      o.stem = *stem;
    } else if (o.stem != *stem && o.stem != "auto") {
      warn_differs("stem", o.stem, *stem);
    }
  }
  if (const auto* width = field("width_mult"); width && metadata_model) {
    const auto recorded = parse_double(*width);
    if (!recorded) throw bad("width_mult", *width, "is not a number");
    if (!flags.given("width-mult")) {
      o.width_mult = *recorded;
    } else if (format("%g", o.width_mult) != *width) {
      warn_differs("width-mult", format("%g", o.width_mult), *width);
    }
  }
  // What the metadata gave must make a run tandem can evaluate; if not, it
  // is the file that is wrong, not the command line (checked above).
  try {
    engine::check_train_options(o);
    data::data_format(o.data);
  } catch (const UsageError& e) {
    // Data given on the command line that the weights' model cannot take
    // (the check names the data flag) is the command line's mistake (exit
    // 2); otherwise the file is wrong.
    const std::string what = e.what();
    // The flag the message begins with, when the command line gave it.
    const auto end = what.find_first_of(" :");
    const std::string flag = what.rfind("--", 0) == 0 ? what.substr(2, end == std::string::npos ? end : end - 2) : "";
    if (!flag.empty() && flags.given(flag)) throw UsageError(what + " (the model of " + file + ")");
    throw Error(file + ": its metadata describes a run tandem cannot evaluate: " + e.what());
  }
  FromWeights from;
  from.augment_or_size_given = flags.given("augment") || flags.given("image-size");
  return from;
}

}  // namespace tandem::cli
