// tandem/data/source.h: data-set specs given on the command line.
//
//   fashion-mnist     Debian's dataset-fashion-mnist, /usr/share/datasets/fashion-mnist
//   idx:DIR           any folder with the four MNIST-layout IDX files (plain or .gz)
//   cifar10:DIR       CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin)
//   cifar100:DIR      CIFAR-100 binary (train.bin, test.bin), fine labels
//   imagefolder:DIR   DIR/<class>/<image> (JPEG, PNG); training only, evaluation
//                     data comes from --val-data imagefolder:DIR2
//   text:FILE|A,B|DIR UTF-8 bytes as tokens, for language models (data/tokens.h)
//   tokens:PATH       llm.c's or nanoGPT's token files (data/tokens.h)
//
// See docs/DATA.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

// The largest --image-size: 8192 x 8192 x 3 float32 is 805 MB an image.
inline constexpr int64_t kMaxImageSize = 8192;

struct DataOptions {
  std::string augment;           // --augment preset; empty: the format's default
  int64_t image_size = 0;        // --image-size; 0: the format's default
  uint64_t seed = 0;             // seeds the random transforms, with (epoch, index)
  bool skip_bad_images = false;  // leave unreadable images out (with a warning)
  int64_t seq_len = 0;           // token data: tokens a sample's inputs hold (required there)
  int64_t vocab_size = 0;        // token data: --vocab-size (0: the files')
  std::string tokenizer;         // token data: --tokenizer (tokenizer.h)
};

// Whether `spec` is token data (text:... or tokens:...), for a language
// model; the others are images.
bool is_token_spec(const std::string& spec);

// Opens both splits of `spec`: the training split with the preset's training
// transforms, the evaluation split with its evaluation transforms. `test` is
// null for a format with no evaluation split of its own (imagefolder). Throws
// tandem::Error naming the spec, and the file at fault, when it cannot be read.
DataSplits open_data(const std::string& spec, const DataOptions& options = {});

// The data to evaluate on for --val-data SPEC: the evaluation split of
// `spec`, or for imagefolder the whole folder, with evaluation transforms.
// IDX after IDX `training` data: the test split alone (no training files
// needed), normalised with the training data's statistics, as its own test
// split is.
std::shared_ptr<const Dataset> open_eval_data(const std::string& spec, const DataOptions& options = {},
                                              const DataSplits* training = nullptr);

// The format a spec names: "idx" (also for fashion-mnist), "cifar10",
// "cifar100", "imagefolder", "text" or "tokens". Throws tandem::Error for an unknown one.
std::string data_format(const std::string& spec);

// `spec` with its folder made absolute ("idx:data" run in /home/me:
// "idx:/home/me/data"), for a record read elsewhere; fashion-mnist as is.
std::string absolute_spec(const std::string& spec);

// Throws tandem::Error, as the readers would, when the folder `spec` names
// is missing or not a folder (for token data: a file it names is missing,
// or its folder or glob names none) ("idx:/x: no such directory"): for a launcher
// to name it once before its workers start, each of which would.
void check_spec_folder(const std::string& spec);

// Refuses evaluation data whose labels do not mean the training data's
// classes (the model has the training data's outputs): class folders of
// other names, class folders on one side and numbered labels on the other,
// numbered labels of another format (cifar100 against cifar10), or labels
// beyond the training classes. Throws tandem::Error starting with `flag`
// and `eval_spec` and naming both; nothing when eval_spec is train_spec.
void check_same_classes(const std::string& train_spec, const DatasetInfo& train,
                        const std::string& eval_spec, const DatasetInfo& eval, const std::string& flag);

// The part of check_same_classes that needs only the evaluation spec, so
// that it can run before the evaluation data is opened: numbered labels
// (IDX, CIFAR) against class folders, or of another format.
void check_same_label_kind(const std::string& train_spec, const DatasetInfo& train, const std::string& eval_spec,
                           const std::string& flag);

// A class list for a message: the first 8 names, then "... (N)".
std::string class_list(const std::vector<std::string>& names);

// The accepted spec forms, one line each, for --help.
std::vector<std::string> data_spec_help();

}  // namespace tandem::data
