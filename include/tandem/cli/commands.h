// tandem/cli/commands.h: the `tandem` subcommands.
//
// Each returns the process exit code: 0 on success, 1 on a runtime error,
// 2 on a usage error. Errors are printed as one line on stderr.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

// tandem train [flags]
int train_command(const std::vector<std::string>& args);

// The train flags' help text (also part of `tandem --help`).
std::string train_help();

// tandem eval [flags]: trained weights evaluated on a data set.
int eval_command(const std::vector<std::string>& args);
std::string eval_help();

// tandem export [flags]: a checkpoint's weights as one safetensors file.
int export_command(const std::vector<std::string>& args);
std::string export_help();

// tandem models: the registered model names.
int models_command(const std::vector<std::string>& args);

// `tandem launch [flags] -- CMD ARGS...`: returns the job's exit code.
int launch_command(const std::vector<std::string>& args);
std::string launch_help();

// Dispatches argv to a subcommand.
int main_command(int argc, char** argv);

}  // namespace tandem::cli
