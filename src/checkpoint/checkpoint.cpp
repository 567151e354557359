#include "tandem/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <torch/optim/sgd.h>
#include <torch/serialize.h>

#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "checkpoint_archive.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;



// Note [loading in place]: libtorch's Module::load and Optimizer::load put
// each tensor read in place of the model's (set_, or set_data when the
// devices differ), so a parameter came back on the device it was saved from
// (rank 1 on cuda:1 resuming rank 0's checkpoint got cuda:0 weights) and
// tied or aliased tensors came apart. The archive is read onto the CPU and
// each value copied into the tensor the model already has, on its device;
// momentum buffers follow their parameter's device.
void load_in_place(torch::nn::Module& module, torch::serialize::InputArchive& archive,
                   const std::string& prefix) {
  torch::NoGradGuard no_grad;
  auto copy_into = [&](const std::string& name, torch::Tensor& into, bool buffer) {
    torch::Tensor saved;
    archive.read(name, saved, buffer);
    TANDEM_CHECK(saved.sizes() == into.sizes(), prefix, name, ": the checkpoint holds ",
                 saved.sizes(), ", the model ", into.sizes());
    into.copy_(saved);
  };
  for (auto& p : module.named_parameters(/*recurse=*/false)) copy_into(p.key(), p.value(), false);
  for (auto& b : module.named_buffers(/*recurse=*/false)) copy_into(b.key(), b.value(), true);
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::InputArchive child_archive;
    archive.read(child.key(), child_archive);
    load_in_place(*child.value(), child_archive, prefix + child.key() + ".");
  }
}

void move_state_to_parameters(torch::optim::Optimizer& optimizer) {
  auto& state = optimizer.state();
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      auto found = state.find(p.unsafeGetTensorImpl());
      if (found == state.end()) continue;
      // Each state tensor of the parameter's shape, on its device
      // (set_parameter_state checks and moves them: optim/state_tensors.h).
      std::map<std::string, torch::Tensor> named;
      for (auto& [name, t] : optim::parameter_state(optimizer, p)) named[name] = t;
      if (!named.empty()) optim::set_parameter_state(optimizer, p, named);
    }
  }
}

// checkpoint-<step>.pt files of `dir`, oldest first.
std::vector<std::pair<int64_t, fs::path>> list_checkpoints(const std::string& dir, bool with_unreadable = false) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  // Only regular files (or links to one) count: a directory, a FIFO or a
  // dangling link named like a checkpoint is neither resumed from (a FIFO
  // would block the read) nor kept in place of a real checkpoint when older
  // ones are removed. At most 18 digits, so that the step fits an int64_t.
  // A sharded checkpoint is a directory checkpoint-<step> holding its
  // manifest (Note [sharded checkpoints]), which rank 0 writes before the
  // rename that names it so. A folder so named without one was damaged
  // since: listed `with_unreadable` for --resume to name it and pass it
  // over, never kept in place of a whole one.
  static const std::regex pattern(R"(checkpoint-(\d{1,18})(\.pt)?)");
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch match;
    std::string name = entry.path().filename().string();
    std::error_code kind;
    if (!std::regex_match(name, match, pattern)) continue;
    const bool counts = match[2].matched ? fs::is_regular_file(entry.path(), kind)
                        : with_unreadable    ? fs::is_directory(entry.path(), kind) ||
                                                fs::is_regular_file(entry.path(), kind)  // a file in its place too
                                             : fs::is_directory(entry.path(), kind) &&
                                                fs::is_regular_file(entry.path() / sharded::kManifest, kind);
    if (counts) found.emplace_back(std::stoll(match[1].str()), entry.path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

}  // namespace


Checkpointer::Checkpointer(CheckpointOptions options) : options_(std::move(options)) {
  TANDEM_CHECK(!options_.dir.empty(), "checkpoint directory is empty");
  TANDEM_CHECK(options_.keep >= 1, "checkpoints kept must be at least 1");
}

std::string Checkpointer::save(const TrainPosition& p, torch::nn::Module& model,
                               torch::optim::Optimizer& optimizer, const std::string& fingerprint,
                               const std::map<std::string, std::string>& weights_metadata) const {
  std::error_code ec;
  fs::create_directories(options_.dir, ec);
  TANDEM_CHECK(!ec, "--checkpoint-dir ", options_.dir, ": cannot create: ", ec.message());
  torch::serialize::OutputArchive archive;
  for (const auto& [key, value] : header_fields(p, fingerprint)) archive.write(key, value);
  torch::serialize::OutputArchive model_archive, optimizer_archive;
  model.save(model_archive);
  optimizer.save(optimizer_archive);
  archive.write("model", model_archive);
  archive.write("optimizer", optimizer_archive);
  archive.write("cpu_rng", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  if (!weights_metadata.empty()) {
    archive.write("weights_metadata", c10::IValue(nlohmann::json(weights_metadata).dump()));
  }

  std::string path = (fs::path(options_.dir) / format("checkpoint-%08lld.pt",
                                                      static_cast<long long>(p.step)))
                         .string();
  std::ostringstream zip;
  archive.save_to(zip);
  const std::string bytes = seal_checkpoint(zip.str());
  write_atomically(path, [&](const std::string& tmp) { internal::write_file(tmp, bytes); });
  prune(p.step);
  return path;
}

void Checkpointer::prune(int64_t step) const {
  // Kept: the newest `keep` up to this step. A file of a later step is none
  // of this run's: a resumed run started from the newest good one, so a
  // later one was damaged (or foreign), and left in place it would take a
  // kept slot and be tried first by every --resume.
  // Nor is one between the step this run resumed from and this one that
  // the run did not write: resuming passed over it as damaged, and kept it
  // would push the good one it resumed from out of the kept slots.
  written_.insert(step);
  auto all = list_checkpoints(options_.dir);
  size_t kept = 0;
  std::error_code ec;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    const bool passed_over = resumed_step_ >= 0 && it->first > resumed_step_ && written_.count(it->first) == 0;
    if (it->first <= step && !passed_over && kept < static_cast<size_t>(options_.keep)) {
      ++kept;
    } else if (fs::is_directory(it->second, ec)) {
      // Renamed first: a folder half removed (its manifest gone first) is
      // then a temporary that the next start clears, not a stray.
      auto doomed = it->second;
      doomed += ".tmp-" + std::to_string(::getpid());
      fs::rename(it->second, doomed, ec);
      fs::remove_all(ec ? it->second : doomed, ec);
    } else {
      fs::remove(it->second, ec);
    }
  }
}

std::vector<std::pair<std::string, c10::IValue>> Checkpointer::header_fields(const TrainPosition& p,
                                                                             const std::string& fingerprint) {
  return {{"format_version", c10::IValue(internal::kFormatVersion)},
          {"fingerprint", c10::IValue(fingerprint)},
          {"epoch", c10::IValue(p.epoch)},
          {"batch_in_epoch", c10::IValue(p.batch_in_epoch)},
          {"step", c10::IValue(p.step)},
          {"epoch_loss_sum", c10::IValue(p.epoch_loss_sum)},
          {"epoch_correct", c10::IValue(p.epoch_correct)},
          {"epoch_seen", c10::IValue(p.epoch_seen)},
          {"loss_scale", c10::IValue(p.loss_scale)},
          {"scale_growth_tracker", c10::IValue(p.scale_growth_tracker)}};
}

std::optional<std::string> Checkpointer::load_newest_good(TrainPosition& position,
                                                          torch::nn::Module& model,
                                                          torch::optim::Optimizer& optimizer,
                                                          const std::string& fingerprint,
                                                          std::vector<std::string>* warnings) const {
  return load_newest_good(
      position, [&](const std::string& path) { return load(path, model, optimizer, fingerprint); }, warnings);
}

std::optional<std::string> Checkpointer::load_newest_good(
    TrainPosition& position, const std::function<TrainPosition(const std::string&)>& load,
    std::vector<std::string>* warnings) const {
  auto all = list_checkpoints(options_.dir, /*with_unreadable=*/true);
  std::string damaged;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      position = load(it->second.string());
      // A file renamed to a later step would be resumed before newer work.
      if (position.step != it->first) {
        throw DamagedCheckpoint(format("cannot resume from %s: its name says step %lld, but it holds step %lld",
                                       it->second.string().c_str(), static_cast<long long>(it->first),
                                       static_cast<long long>(position.step)));
      }
      resumed_step_ = position.step;
      return it->second.string();
    } catch (const DamagedCheckpoint& e) {  // an older one may be good: atomic writes keep it
      if (warnings) warnings->push_back(std::string(e.what()) + "; trying the one before it");
      damaged += std::string(damaged.empty() ? " " : "; ") + e.what();
    }
  }
  TANDEM_CHECK(damaged.empty(), "--resume: no usable checkpoint in ", options_.dir, ":", damaged);
  return std::nullopt;
}

namespace {

// A fingerprint's KEY=VALUE fields in order. A field starts at a word whose
// KEY is lower-case letters and underscores; any other word belongs to the
// value before it, so that a --data path with a space in it stays one
// value ("data=idx:/my data").
std::vector<std::pair<std::string, std::string>> fingerprint_fields(const std::string& fingerprint) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::istringstream words(fingerprint);
  for (std::string word; words >> word;) {
    const auto eq = word.find('=');
    const bool starts_field =
        eq != std::string::npos && eq > 0 &&
        std::all_of(word.begin(), word.begin() + static_cast<std::ptrdiff_t>(eq),
                    [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; });
    if (starts_field || fields.empty()) {
      fields.emplace_back(word.substr(0, eq), eq == std::string::npos ? "" : word.substr(eq + 1));
    } else {
      fields.back().second += " " + word;
    }
  }
  return fields;
}

bool contains(const std::vector<std::string>& keys, const std::string& key) {
  return std::find(keys.begin(), keys.end(), key) != keys.end();
}

}  // namespace

std::string without_fields(const std::string& fingerprint, const std::vector<std::string>& keys) {
  std::string kept;
  for (const auto& [key, value] : fingerprint_fields(fingerprint)) {
    if (!contains(keys, key)) kept += (kept.empty() ? "" : " ") + key + "=" + value;
  }
  return kept;
}

std::string fingerprint_differences(const std::string& checkpoint, const std::string& run,
                                   const std::vector<std::string>& ignored, const std::string& checkpoint_label,
                                   const std::string& run_label) {
  // KEY -> VALUE of each fingerprint, keys in the order they first appear.
  std::vector<std::string> keys;
  std::map<std::string, std::string> values[2];
  const std::string* sides[2] = {&checkpoint, &run};
  for (int side = 0; side < 2; ++side) {
    for (const auto& [key, value] : fingerprint_fields(*sides[side])) {
      if (contains(ignored, key)) continue;
      if (!contains(keys, key)) keys.push_back(key);
      values[side][key] = value;
    }
  }
  std::string text;
  for (const auto& key : keys) {
    auto in_checkpoint = values[0].find(key), in_run = values[1].find(key);
    bool both = in_checkpoint != values[0].end() && in_run != values[1].end();
    if (both && in_checkpoint->second == in_run->second) continue;
    auto shown = [&](const std::map<std::string, std::string>& side,
                     std::map<std::string, std::string>::const_iterator it) {
      return it == side.end() ? "no " + key : key + "=" + it->second;
    };
    text += (text.empty() ? "" : ", ") + shown(values[0], in_checkpoint) + " " + checkpoint_label + ", " +
            shown(values[1], in_run) + " " + run_label;
  }
  return text;
}

std::optional<std::string> fingerprint_field(const std::string& fingerprint, const std::string& key) {
  for (const auto& [k, value] : fingerprint_fields(fingerprint)) {
    if (k == key) return value;
  }
  return std::nullopt;
}

void Checkpointer::check_writable() const {
  std::error_code ec;
  const std::string kind = path_kind(options_.dir);
  TANDEM_CHECK(kind == "nothing" || kind == "a folder", "--checkpoint-dir ", printable(options_.dir), ": is ", kind,
               "; expected a folder (or nothing there yet)");
  fs::create_directories(options_.dir, ec);
  TANDEM_CHECK(!ec, "--checkpoint-dir ", options_.dir, ": cannot create: ", ec.message());
  const std::string probe =
      (fs::path(options_.dir) / (".tandem-write-check-" + std::to_string(::getpid()))).string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  TANDEM_CHECK(fd >= 0, "--checkpoint-dir ", options_.dir, ": cannot write there: ", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

void Checkpointer::lock() {
  const std::string path = (fs::path(options_.dir) / ".tandem-lock").string();
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, "--checkpoint-dir ", options_.dir, ": cannot open ", path, ": ", std::strerror(errno));
  lock_ = std::shared_ptr<const int>(new int(fd), [](const int* p) {
    ::close(*p);
    delete p;
  });
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[32] = {0};
    const ssize_t n = ::pread(fd, holder, sizeof holder - 1, 0);
    std::string pid = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string();
    pid.erase(pid.find_last_not_of(" \n") + 1);
    lock_.reset();
    TANDEM_CHECK(error != EWOULDBLOCK, "--checkpoint-dir ", options_.dir, " is in use by another run",
                 pid.empty() ? std::string() : " (process " + pid + ")", ", which holds ", path,
                 "; give another directory, or wait until that run ends (--resume then continues it)");
    return;  // a file system without locks (some network ones): checkpoints as before, unguarded
  }
  const std::string mine = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0 && ::pwrite(fd, mine.data(), mine.size(), 0) < 0) {
    // The PID is only for another run's message; the lock itself is held.
  }
}

std::vector<std::string> Checkpointer::remove_stale_temporaries() const {
  std::vector<std::string> removed;
  // A file being written (write_atomically), or a sharded checkpoint's
  // directory before rank 0 renames it.
  static const std::regex pattern(R"(checkpoint-\d{1,18}(?:\.pt)?\.tmp-(\d{1,9}))");
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options_.dir, ec)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    std::error_code kind;
    const auto status = entry.symlink_status(kind);
    if (!std::regex_match(name, match, pattern) || !(fs::is_regular_file(status) || fs::is_directory(status))) continue;
    const auto pid = static_cast<pid_t>(std::stol(match[1].str()));
    if (pid <= 0 || pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
    std::error_code gone;
    if (fs::remove_all(entry.path(), gone) > 0) removed.push_back(name);
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

std::optional<std::string> Checkpointer::latest() const {
  auto all = list_checkpoints(options_.dir, /*with_unreadable=*/true);
  if (all.empty()) return std::nullopt;
  return all.back().second.string();
}

TrainPosition Checkpointer::load(const std::string& path, torch::nn::Module& model,
                                 torch::optim::Optimizer& optimizer,
                                 const std::string& fingerprint) const {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return load_sharded(path, model, optimizer, fingerprint);
  std::string bytes;
  try {
    bytes = internal::verified_archive(path);
  } catch (const tandem::Error& e) {
    throw DamagedCheckpoint("cannot resume from " + path + ": " + e.what());
  }
  return load_archive(bytes, path, model, optimizer, fingerprint);
}

void Checkpointer::check_settings(const std::string& saved, const std::string& fingerprint) const {
  TANDEM_CHECK(without_fields(saved, options_.may_change) == without_fields(fingerprint, options_.may_change),
               "it was written by a run with other settings (",
               fingerprint_differences(saved, fingerprint, options_.may_change),
               "); resume with the checkpoint's settings, or train afresh in another "
               "--checkpoint-dir (the checkpoint's: ", saved, "; this run's: ", fingerprint, ")");
}

TrainPosition Checkpointer::load_archive(const std::string& bytes, const std::string& path,
                                         torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                         const std::string& fingerprint) const {
  torch::serialize::InputArchive archive;
  TrainPosition p;
  try {
    internal::load_checked_archive(bytes, archive);  // Note [pickle bounds], Note [storage records]
    std::map<std::string, c10::IValue> header;
    for (const auto& [key, value] : header_fields(p, "")) {
      if (!archive.try_read(key, header[key])) header.erase(key);
    }
    p = position_of(header, fingerprint);
    torch::serialize::InputArchive model_archive, optimizer_archive;
    archive.read("model", model_archive);
    archive.read("optimizer", optimizer_archive);
    load_in_place(model, model_archive, "");
    for (const auto& item : model.named_parameters()) internal::check_finite(item.value(), path, item.key());
    optimizer.load(optimizer_archive);
    move_state_to_parameters(optimizer);
    torch::Tensor rng;
    archive.read("cpu_rng", rng, /*is_buffer=*/true);
    internal::set_cpu_rng(rng);
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const tandem::Error& e) {
    TANDEM_FAIL("cannot resume from ", path, ": ", e.what());
  } catch (const std::exception& e) {
    std::string what = e.what();
    TANDEM_FAIL("cannot resume from ", path, ": not a readable tandem checkpoint (",
                what.substr(0, what.find('\n')), ")");
  }
  return p;
}

}  // namespace tandem::checkpoint

namespace tandem::checkpoint {

TrainPosition Checkpointer::position_of(const std::map<std::string, c10::IValue>& header,
                                        const std::string& fingerprint) const {
  auto get = [&](const char* key) -> const c10::IValue& {
    auto found = header.find(key);
    TANDEM_CHECK(found != header.end(), "not a readable tandem checkpoint (it holds no ", key, ")");
    return found->second;
  };
  TrainPosition p;
  const int64_t version = get("format_version").toInt();
  TANDEM_CHECK(version == internal::kFormatVersion, "format version ", version, ", expected ",
               internal::kFormatVersion);
  check_settings(get("fingerprint").toStringRef(), fingerprint);
  p.fingerprint = get("fingerprint").toStringRef();
  p.epoch = get("epoch").toInt();
  p.batch_in_epoch = get("batch_in_epoch").toInt();
  p.step = get("step").toInt();
  p.epoch_loss_sum = get("epoch_loss_sum").toDouble();
  p.epoch_correct = get("epoch_correct").toInt();
  p.epoch_seen = get("epoch_seen").toInt();
  TANDEM_CHECK(p.epoch >= 0 && p.batch_in_epoch >= 0 && p.step >= 0 && p.epoch_correct >= 0 && p.epoch_seen >= 0 &&
                   p.epoch_correct <= p.epoch_seen,
               "not a readable tandem checkpoint (position epoch ", p.epoch, ", batch ", p.batch_in_epoch, ", step ",
               p.step, ", ", p.epoch_correct, " of ", p.epoch_seen, " correct: expected counts >= 0)");
  if (header.count("loss_scale")) {  // absent from checkpoints written before --amp
    p.loss_scale = get("loss_scale").toDouble();
    p.scale_growth_tracker = get("scale_growth_tracker").toInt();
  }
  return p;
}

void internal::check_finite(const torch::Tensor& weight, const std::string& path, const std::string& name) {
  if (weight.is_floating_point() && !torch::isfinite(weight).all().item<bool>()) {
    throw DamagedCheckpoint(format("cannot resume from %s: damaged: its weights hold NaN or infinite values "
                                   "(%s), as a diverged run's do",
                                   path.c_str(), name.c_str()));
  }
}

void internal::set_cpu_rng(const torch::Tensor& rng) {
  at::Generator generator = at::detail::getDefaultCPUGenerator();  // a handle
  // libtorch refuses other states in its own terms ("RNG state must be
  // contiguous"); this names the checkpoint's field and what it must be.
  const int64_t state_bytes = generator.get_state().numel();
  TANDEM_CHECK(rng.defined() && rng.scalar_type() == torch::kByte && rng.dim() == 1 && rng.numel() == state_bytes &&
                   rng.is_contiguous(),
               "damaged: its random-number state (cpu_rng: ", rng.defined() ? rng.sizes() : c10::IntArrayRef{}, ", ",
               rng.defined() ? rng.scalar_type() : torch::kByte, ") is not the ", state_bytes,
               " packed bytes of a CPU generator's state");
  generator.set_state(rng);
}

}  // namespace tandem::checkpoint
