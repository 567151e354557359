// Reading a sharded checkpoint in the Checkpointer (checkpoint.h; Note
// [sharded checkpoints]): its whole model and optimizer state, assembled,
// load as a one-file checkpoint's do, through the same checks. Writing one
// is in checkpoint_sharded_save.cpp.
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/optim/adamw.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/util/check.h"
#include "tandem/util/table.h"
#include "checkpoint_archive.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;

// The header keys that hold the optimizer's options (rank 0's file), not
// the position.
const std::vector<std::string> kSgdKeys = {"lr",  "momentum", "dampening", "weight_decay", "nesterov",
                                           "optimizer", "beta1", "beta2", "eps", "amsgrad"};

// `whole` (the run's optimizer over the whole model) given the state of the
// checkpoint's "optimizer.<name>.<slot>" tensors (optim/state_tensors.h),
// saved into `archive` as the run's optimizer would save it.
void write_optimizer(torch::optim::Optimizer& whole, const torch::nn::Module& model,
                     const std::map<std::string, torch::Tensor>& tensors, torch::serialize::OutputArchive& archive) {
  for (const auto& named : model.named_parameters()) {
    std::map<std::string, torch::Tensor> state;
    for (const auto& slot : optim::state_slots(whole, named.value())) {
      auto found = tensors.find("optimizer." + named.key() + "." + slot.name);
      if (found != tensors.end()) state[slot.name] = found->second;
    }
    if (!state.empty()) optim::set_parameter_state(whole, named.value(), state);
  }
  whole.save(archive);
}

// Writes `module`'s parameters and buffers from `tensors` (by their names
// in the model, under "model.") into `archive` in the layout Module::save
// gives them, so that the archive loads as a one-file checkpoint's model.
// A name the checkpoint lacks is left out (the load then names it).
void write_module(const torch::nn::Module& module, const std::string& prefix,
                  const std::map<std::string, torch::Tensor>& tensors, torch::serialize::OutputArchive& archive) {
  auto write = [&](const std::string& key, bool buffer) {
    auto found = tensors.find("model." + prefix + key);
    if (found != tensors.end()) archive.write(key, found->second, buffer);
  };
  for (const auto& p : module.named_parameters(/*recurse=*/false)) write(p.key(), false);
  for (const auto& b : module.named_buffers(/*recurse=*/false)) write(b.key(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive;
    write_module(*child.value(), prefix + child.key() + ".", tensors, child_archive);
    archive.write(child.key(), child_archive);
  }
}

}  // namespace

TrainPosition Checkpointer::load_sharded(const std::string& dir, torch::nn::Module& model,
                                         torch::optim::Optimizer& optimizer, const std::string& fingerprint) const {
  AssembledCheckpoint c;
  try {
    c = sharded::read(dir);
  } catch (const DamagedCheckpoint& e) {
    throw DamagedCheckpoint("cannot resume from " + dir + ": " + e.what());
  }
  // The settings first: another run's shapes (--vocab-size) would fail the
  // assembly below in the optimizer state's terms rather than these.
  const auto saved = c.header.find("fingerprint");
  if (saved != c.header.end() && saved->second.isString()) {
    try {
      check_settings(saved->second.toStringRef(), fingerprint);
    } catch (const tandem::Error& e) {
      TANDEM_FAIL("cannot resume from ", dir, ": ", e.what());
    }
  }
  // The same checkpoint as one file's archive: the header, the model in
  // Module::save's layout, SGD's state over the model's parameters.
  const std::map<std::string, torch::Tensor> tensors(c.tensors.begin(), c.tensors.end());
  torch::serialize::OutputArchive archive;
  for (const auto& [key, value] : c.header) {
    if (std::find(kSgdKeys.begin(), kSgdKeys.end(), key) == kSgdKeys.end()) archive.write(key, value);
  }
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  write_module(model, "", tensors, model_archive);
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&optimizer.defaults())) {
    // Its options are the run's (the fingerprint holds them), in its groups.
    TANDEM_CHECK(c.header.count("optimizer") && c.header.at("optimizer").toStringRef() == "adamw",
                 "cannot resume from ", dir, ": its optimizer state is not AdamW's (--optimizer differs)");
    optim::AdamW whole(optim::decay_groups(model.named_parameters(), *adamw), *adamw);
    write_optimizer(whole, model, tensors, optimizer_archive);
  } else {
    TANDEM_CHECK(!c.header.count("optimizer"), "cannot resume from ", dir, ": its optimizer state is ",
                 c.header.at("optimizer").toStringRef(), "'s, this run's SGD (--optimizer differs)");
    torch::optim::SGDOptions options(0.0);
    try {
      options.lr(c.header.at("lr").toDouble())
          .momentum(c.header.at("momentum").toDouble())
          .dampening(c.header.at("dampening").toDouble())
          .weight_decay(c.header.at("weight_decay").toDouble())
          .nesterov(c.header.at("nesterov").toBool());
    } catch (const std::exception&) {
      TANDEM_FAIL("cannot resume from ", dir, ": not a readable tandem checkpoint (", sharded::rank_file(0),
                  " holds no SGD options)");
    }
    std::vector<torch::Tensor> parameters;
    for (const auto& named : model.named_parameters()) parameters.push_back(named.value());
    torch::optim::SGD whole(parameters, options);
    write_optimizer(whole, model, tensors, optimizer_archive);
  }
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("cpu_rng", c.cpu_rng, /*is_buffer=*/true);
  std::ostringstream zip;
  archive.save_to(zip);
  return load_archive(zip.str(), dir, model, optimizer, fingerprint);
}

Checkpointer::HeldLoad Checkpointer::load_held(const std::string& dir, std::vector<StatePiece>& held,
                                               const std::string& fingerprint,
                                               const std::set<std::string>& finite) const {
  HeldLoad out;
  torch::Tensor rng;
  try {
    out.absent = sharded::read_into(
        dir, held,
        [&](const std::map<std::string, c10::IValue>& header, const torch::Tensor& cpu_rng) {
          out.header = header;
          out.position = position_of(header, fingerprint);  // the settings before any state is read
          rng = cpu_rng;
        },
        [&](const std::string& name, const torch::Tensor& data) {
          // Every rank sees every weight: all pass over the same checkpoints.
          if (name.rfind("model.", 0) == 0 && finite.count(name.substr(6))) {
            internal::check_finite(data, dir, name.substr(6));
          }
        });
    internal::set_cpu_rng(rng);
  } catch (const DamagedCheckpoint& e) {
    const std::string what = e.what();
    if (what.rfind("cannot resume from ", 0) == 0) throw;
    throw DamagedCheckpoint("cannot resume from " + dir + ": " + what);
  } catch (const tandem::Error& e) {
    TANDEM_FAIL("cannot resume from ", dir, ": ", e.what());
  }
  return out;
}

}  // namespace tandem::checkpoint
