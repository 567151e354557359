// tandem export: a checkpoint's weights as one safetensors file with the
// model's names, whatever layout wrote the checkpoint.
#include <cstdio>
#include <filesystem>
#include <map>
#include <regex>
#include <string>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/cli/commands.h"
#include "tandem/cli/flags.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

FlagSet export_flags(std::string& checkpoint, std::string& out) {
  FlagSet flags("tandem export",
                "Write a checkpoint's weights as one safetensors file, under the model's parameter and "
                "buffer names, with the metadata --export-weights records (the model, its classes, "
                "its data and transforms), so that tandem eval --weights, --init-weights and other "
                "tools read it. Any checkpoint does, whatever devices, ranks and mesh wrote it: "
                "checkpoints hold the whole model.");
  flags.add_string("checkpoint", "PATH", &checkpoint,
                   "a checkpoint file, or a --checkpoint-dir (its newest checkpoint whose checksum "
                   "holds) (required)");
  flags.add_string("out", "FILE", &out, "the safetensors file to write (required)");
  return flags;
}

}  // namespace

std::string export_help() {
  std::string checkpoint, out;
  return export_flags(checkpoint, out).help();
}

namespace {

// Writing the weights over a checkpoint's file (checkpoint-N.pt, or a file
// of a sharded checkpoint-N/ folder) would destroy what they are read from.
void check_not_a_checkpoint(const std::string& checkpoint, const std::string& out) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto target = fs::weakly_canonical(out, ec);
  const auto source = fs::weakly_canonical(checkpoint, ec);
  const std::regex checkpoint_name(R"(checkpoint-[0-9]+(\.pt)?)");
  const bool named_so = std::regex_match(target.filename().string(), checkpoint_name) ||
                        std::regex_match(target.parent_path().filename().string(), checkpoint_name);
  if (target == source || named_so) {
    throw UsageError("--out " + printable(out) + ": is a checkpoint's file, or in a checkpoint's folder; writing "
                     "the weights there would replace what they are read from: name a file elsewhere");
  }
}

}  // namespace

int export_command(const std::vector<std::string>& args) {
  std::string checkpoint, out;
  auto flags = export_flags(checkpoint, out);
  flags.parse(args);
  if (flags.help_requested()) {
    std::printf("%s", flags.help().c_str());
    return 0;
  }
  if (checkpoint.empty()) throw UsageError("--checkpoint PATH is required (a checkpoint file or a --checkpoint-dir)");
  if (out.empty()) throw UsageError("--out FILE is required (the safetensors file to write)");
  check_not_a_checkpoint(checkpoint, out);
  check_output_file("--out", out);
  check_replaceable_file("--out", out);
  auto weights = checkpoint::read_checkpoint_weights(checkpoint);
  for (const auto& line : weights.passed_over) {  // newer checkpoints that were damaged: said, not skipped silently
    std::fprintf(stderr, "tandem: warning: passed over %s\n", printable(line).c_str());
  }
  auto metadata = weights.metadata;
  metadata["format"] = "pt";
  metadata["producer"] = "tandem";
  if (metadata.count("model") == 0) {  // a checkpoint from before its metadata was kept
    if (auto model = checkpoint::fingerprint_field(weights.fingerprint, "model")) metadata["model"] = *model;
  }
  metadata["checkpoint_step"] = std::to_string(weights.step);
  checkpoint::write_safetensors(out, weights.tensors, metadata);
  std::printf("weights of %s (step %lld, %zu tensors) written to %s\n", printable(checkpoint).c_str(),
              static_cast<long long>(weights.step), weights.tensors.size(), printable(out).c_str());
  return 0;
}

}  // namespace tandem::cli
