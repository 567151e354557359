// tandem/data/source.h: data-set specs given on the command line.
//
//   fashion-mnist     Debian's dataset-fashion-mnist, /usr/share/datasets/fashion-mnist
//   idx:DIR           any folder with the four MNIST-layout IDX files (plain or .gz)
//   cifar10:DIR       CIFAR-10 binary batches (data_batch_1..5.bin, test_batch.bin)
//   cifar100:DIR      CIFAR-100 binary (train.bin, test.bin), fine labels
//   imagefolder:DIR   DIR/<class>/<image> (JPEG, PNG); training only, evaluation
//                     data comes from --val-data imagefolder:DIR2
//
// See docs/DATA.md.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

struct DataOptions {
  std::string augment;           // --augment preset; empty: the format's default
  int64_t image_size = 0;        // --image-size; 0: the format's default
  uint64_t seed = 0;             // seeds the random transforms, with (epoch, index)
  bool skip_bad_images = false;  // leave unreadable images out (with a warning)
};

// Opens both splits of `spec`: the training split with the preset's training
// transforms, the evaluation split with its evaluation transforms. `test` is
// null for a format with no evaluation split of its own (imagefolder). Throws
// tandem::Error naming the spec, and the file at fault, when it cannot be read.
DataSplits open_data(const std::string& spec, const DataOptions& options = {});

// The data to evaluate on for --val-data SPEC: the evaluation split of
// `spec`, or for imagefolder the whole folder, with evaluation transforms.
std::shared_ptr<const Dataset> open_eval_data(const std::string& spec,
                                              const DataOptions& options = {});

// The accepted spec forms, one line each, for --help.
std::vector<std::string> data_spec_help();

}  // namespace tandem::data
