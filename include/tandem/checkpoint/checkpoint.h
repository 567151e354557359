// tandem/checkpoint/checkpoint.h: training state saved to and restored from disk.
//
// A checkpoint is DIR/checkpoint-<step>.pt, a libtorch archive holding the
// position in training (epoch, batch within the epoch, optimizer step), the
// running sums of the epoch in progress, the model's parameters and buffers,
// the optimizer state, the default CPU generator's state, and a fingerprint of
// the flags that must not change on resume, followed by a checksum trailer;
// or the directory DIR/checkpoint-<step> of a sharded checkpoint, written by
// every rank (sharded_checkpoint.h). Either is written atomically; the
// newest `keep` are kept. See docs/CHECKPOINTS.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/dist/process_group.h"
#include "tandem/util/check.h"

namespace tandem::checkpoint {

struct TrainPosition {
  int64_t epoch = 0;            // epoch in progress (0-based)
  int64_t batch_in_epoch = 0;   // batches of `epoch` already trained
  int64_t step = 0;             // optimizer steps taken in all
  double epoch_loss_sum = 0.0;  // sums over the batches of `epoch` so far
  int64_t epoch_correct = 0;    // predictions right: samples, or a language model's tokens
  int64_t epoch_seen = 0;       // predictions made
  double loss_scale = 0.0;           // --amp fp16: the gradient scaler's state (0: none)
  int64_t scale_growth_tracker = 0;
  std::string fingerprint;  // load(): the fingerprint the checkpoint was written with
};

// A checkpoint file that is cut short, altered, or not a tandem checkpoint:
// its checksum trailer (docs/CHECKPOINTS.md) does not check out.
class DamagedCheckpoint : public Error {
 public:
  using Error::Error;
};

// A checkpoint file's bytes: `archive` (a libtorch archive) followed by its
// checksum trailer (Note [checkpoint trailer] in src/checkpoint/checkpoint.cpp),
// as save() writes them; fuzz/fuzz_checkpoint seals its inputs with it.
std::string seal_checkpoint(std::string archive);

struct CheckpointOptions {
  std::string dir;
  int64_t keep = 2;  // newest checkpoints kept
  // Fingerprint fields (its space-separated KEY=VALUE words, by KEY) that a
  // resumed run may change: they are left out when the fingerprints are
  // compared. The trainer names "world": Note [resuming on another world size].
  std::vector<std::string> may_change;
};

// `fingerprint` without its KEY=VALUE words whose KEY is in `keys`.
std::string without_fields(const std::string& fingerprint, const std::vector<std::string>& keys);

// The fields in which two fingerprints differ, KEYs in `ignored` left out,
// as "KEY=A in the checkpoint, KEY=B in this run" joined by ", " ("no KEY"
// for a field one side lacks; the two labels are the sides' names); empty
// when they agree.
std::string fingerprint_differences(const std::string& checkpoint, const std::string& run,
                                    const std::vector<std::string>& ignored,
                                    const std::string& checkpoint_label = "in the checkpoint",
                                    const std::string& run_label = "in this run");

// The VALUE of `fingerprint`'s KEY=VALUE word for `key`, if it has one.
std::optional<std::string> fingerprint_field(const std::string& fingerprint, const std::string& key);

class Checkpointer {
 public:
  explicit Checkpointer(CheckpointOptions options);

  // Writes checkpoint-<position.step>.pt and prunes older ones. Returns its
  // path. `weights_metadata` (what --export-weights would record beside the
  // weights) is kept in it for `tandem export`.
  std::string save(const TrainPosition& position, torch::nn::Module& model,
                   torch::optim::Optimizer& optimizer, const std::string& fingerprint,
                   const std::map<std::string, std::string>& weights_metadata = {}) const;

  // Writes the sharded checkpoint DIR/checkpoint-<position.step> (Note
  // [sharded checkpoints] in sharded_checkpoint.h) and prunes older ones:
  // every rank of `group` (null: one process) calls it together (a collective), with the pieces
  // it owns; rank 0's header also records `optimizer`'s options (SGD's).
  // Returns the directory's path on every rank.
  std::string save_sharded(const TrainPosition& position, const std::vector<StatePiece>& mine,
                           torch::optim::Optimizer& optimizer, const std::string& fingerprint,
                           const std::map<std::string, std::string>& weights_metadata,
                           dist::ProcessGroup* group, const torch::Device& device) const;
  // Creates the directory if need be and checks that a file can be made
  // there (then removes it), so that a run learns at its start, not at its
  // first save, that its checkpoints cannot be written. Throws naming the
  // directory and the system's reason.
  void check_writable() const;

  // Takes DIR/.tandem-lock (flock; held until this Checkpointer, or the
  // process, ends), so that a second run started on the same directory is
  // refused instead of writing its checkpoints over this one's. The writer
  // (rank 0) takes it, after check_writable. Throws naming the holder's PID.
  void lock();

  // Removes the temporary files ("checkpoint-N.pt.tmp-PID", atomic_file.h)
  // that a process of this host killed while writing a checkpoint left
  // behind: those whose PID no longer runs. A live PID's file is left alone
  // (another run may be writing it). Returns the names removed.
  std::vector<std::string> remove_stale_temporaries() const;

  // The newest checkpoint in the directory, if any.
  std::optional<std::string> latest() const;

  // Loads the newest checkpoint whose checksum holds, newest first: a
  // damaged one is passed over with a line in `warnings`. Returns its path,
  // or nullopt for an empty folder. Throws if every checkpoint is damaged,
  // listing them, or (like load) for other settings.
  std::optional<std::string> load_newest_good(TrainPosition& position, torch::nn::Module& model,
                                              torch::optim::Optimizer& optimizer,
                                              const std::string& fingerprint,
                                              std::vector<std::string>* warnings) const;
  // The same with each candidate (a checkpoint file, or a sharded
  // checkpoint's directory) loaded by `load`.
  std::optional<std::string> load_newest_good(TrainPosition& position,
                                              const std::function<TrainPosition(const std::string& path)>& load,
                                              std::vector<std::string>* warnings) const;

  // Restores model, optimizer and generator from `path`, a checkpoint file
  // or a sharded checkpoint's directory (its tensors assembled whole, then
  // loaded as a file's are). Throws
  // DamagedCheckpoint if its checksum fails (nothing is loaded then), and
  // tandem::Error naming the file if it is unreadable or was written with
  // other flags (fingerprints that differ beyond options.may_change).
  TrainPosition load(const std::string& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const std::string& fingerprint) const;

  // Restores what this rank holds from the sharded checkpoint `dir` (Note
  // [loading by overlap] in sharded_checkpoint.h): each of `held`'s pieces
  // filled, and the CPU generator's state. The settings are checked first
  // (as load()'s); a parameter named in `finite` (the model's names) that
  // holds NaN or infinite values makes it DamagedCheckpoint, as load()
  // does. Returns the position, rank 0's header (the optimizer's options
  // at the step it was written: "lr", ...) and the names among `held` that
  // the checkpoint lacks.
  struct HeldLoad {
    TrainPosition position;
    std::map<std::string, c10::IValue> header;
    std::set<std::string> absent;
  };
  HeldLoad load_held(const std::string& dir, std::vector<StatePiece>& held, const std::string& fingerprint,
                     const std::set<std::string>& finite) const;

 private:
  TrainPosition load_archive(const std::string& bytes, const std::string& path, torch::nn::Module& model,
                             torch::optim::Optimizer& optimizer, const std::string& fingerprint) const;
  TrainPosition load_sharded(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                             const std::string& fingerprint) const;
  void prune(int64_t step) const;  // keeps the newest `keep` up to `step`
  // Refuses a checkpoint whose fingerprint (`saved`) differs from this
  // run's beyond options.may_change, naming the fields that differ.
  void check_settings(const std::string& saved, const std::string& fingerprint) const;
  // The position a checkpoint's header holds (header_fields' keys), its
  // format and settings checked against this run's `fingerprint`.
  TrainPosition position_of(const std::map<std::string, c10::IValue>& header, const std::string& fingerprint) const;
  // The position and fingerprint as a checkpoint's archive holds them.
  static std::vector<std::pair<std::string, c10::IValue>> header_fields(const TrainPosition& p,
                                                                       const std::string& fingerprint);

  CheckpointOptions options_;
  std::shared_ptr<const int> lock_;  // the lock file's descriptor, closed with the last copy
  // The step load_newest_good resumed from (-1: none) and the steps this
  // run wrote since: a checkpoint between them that this run did not
  // write was passed over as damaged (prune()).
  mutable int64_t resumed_step_ = -1;
  mutable std::set<int64_t> written_;
};

// A checkpoint's model weights, read without building the model (`tandem
// export`): every parameter and buffer by its name in the model, the
// weights' metadata the training run recorded (empty for a checkpoint
// written before it did), the step and the fingerprint.
struct CheckpointWeights {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;
  int64_t step = 0;
  std::string fingerprint;
  // A --checkpoint-dir: its newer checkpoints passed over as damaged, each
  // "PATH: what is wrong", for the caller to say.
  std::vector<std::string> passed_over;
};

// Reads `path`, a checkpoint file, or a --checkpoint-dir (its newest
// checkpoint whose checksum holds). Every check of a resume applies; throws
// tandem::Error naming the file and what is wrong with it.
CheckpointWeights read_checkpoint_weights(const std::string& path);

}  // namespace tandem::checkpoint
