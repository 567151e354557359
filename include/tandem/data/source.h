// tandem/data/source.h: data-set specs given on the command line.
//
//   fashion-mnist   Debian's dataset-fashion-mnist, /usr/share/datasets/fashion-mnist
//   idx:DIR         any folder with the four MNIST-layout IDX files (plain or .gz)
//
// See docs/DATA.md.
#pragma once

#include <string>
#include <vector>

#include "tandem/data/dataset.h"

namespace tandem::data {

// Opens both splits of `spec`. Throws tandem::Error naming the spec, and the
// file at fault, when it cannot be read.
DataSplits open_data(const std::string& spec);

// The accepted spec forms, one line each, for --help.
std::vector<std::string> data_spec_help();

}  // namespace tandem::data
