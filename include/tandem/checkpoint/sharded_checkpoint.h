// tandem/checkpoint/sharded_checkpoint.h: a checkpoint written by every rank,
// each with only what it owns (PyTorch's distributed checkpoint, in idea).
//
// Note [sharded checkpoints]: a job of several ranks holds its state in
// pieces: FSDP's shards, ZeRO-1's momentum, a pipeline's stages. Gathering
// it all on rank 0 to write one file costs that rank the whole model's
// memory and the job a collective per tensor. Instead each rank writes the
// pieces it owns (a tensor replicated over data-parallel ranks is written
// by the first of them), in parallel, into DIR/checkpoint-<step>/:
//   rank-<r>.pt    a sealed archive (Note [checkpoint trailer]): its
//                  pieces, 1-D runs of a named tensor's elements in that
//                  tensor's memory order, and an index of them; rank 0's
//                  also the position, fingerprint, optimizer options and
//                  the CPU generator's state
//   manifest.json  written by rank 0 once every rank's file is: for every
//                  tensor, its dtype, shape, strides and where its pieces
//                  are (file, key, offset, elements)
// The directory is written as checkpoint-<step>.tmp-<pid> and renamed when
// whole, so a checkpoint either is complete or is not one. Reading
// assembles every tensor whole (each element from exactly one piece) on
// every rank, whatever layout wrote it (read, for `tandem export`); a run
// resuming reads only the parts it holds (read_into, Note [loading by
// overlap]). So any layout resumes any other.
//
// Note [loading by overlap]: a rank that resumes names each part of the
// state it holds as a piece (a run of the whole tensor's elements in some
// memory order: FSDP's dim-0 shard, tp's rows with the cut dimension
// outermost, a replicated tensor whole) and gets its elements from the
// checkpoint's pieces that overlap it, as PyTorch's distributed checkpoint
// loads by overlapping chunks. Where the writer's memory order was the
// same, an overlap is one run of each; else each written element's place
// in the wanted order is computed (an index as long as the written piece,
// for the moment it is copied). No rank assembles a whole tensor, let
// alone the whole model: a rank holds its part and one file's pieces at a
// time. Every rank reads every file, so that all reach the same verdict
// on a damaged one.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace tandem::checkpoint {

// A run of a named tensor's elements that one rank owns: `data` (1-D)
// holds the elements offset .. offset + numel of the tensor `name` (shape
// `shape`, strides `strides`: their order in memory), whose place among
// the checkpoint's tensors is `order` (the model's own order, then the
// optimizer's). Names: "model.<parameter or buffer>", "optimizer.<parameter>.<state>" (momentum_buffer;
// AdamW's step, exp_avg, exp_avg_sq: optim/state_tensors.h).
struct StatePiece {
  std::string name;
  int64_t order = 0;
  std::vector<int64_t> shape, strides;
  int64_t offset = 0;
  torch::Tensor data;
};

// A sharded checkpoint read back: every tensor whole (contiguous, on the
// CPU), in the checkpoint's order, and rank 0's header.
struct AssembledCheckpoint {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, c10::IValue> header;  // "epoch", "fingerprint", "lr", ...
  torch::Tensor cpu_rng;
};

namespace sharded {

// The manifest's name in a checkpoint directory.
inline constexpr const char* kManifest = "manifest.json";
// rank-<r>.pt
std::string rank_file(int64_t rank);

// What every file of one checkpoint records of it: an id rank 0 draws for
// each checkpoint written, the job's ranks and the step. A file of another
// checkpoint (copied in, or left by an earlier write) does not match.
struct Identity {
  std::string id;
  int64_t ranks = 1;
  int64_t step = 0;
};

// Writes this rank's file into `dir` (atomically) and returns its index:
// the JSON text of its pieces, for rank 0's manifest. `header` (rank 0
// only) holds the position and settings; `with_rng` adds the CPU
// generator's state.
std::string write_rank_file(const std::string& dir, int64_t rank, const Identity& identity,
                            const std::vector<StatePiece>& pieces, const std::map<std::string, c10::IValue>& header,
                            bool with_rng);

// Rank 0: the manifest from every rank's index, in rank order, written
// into `dir`. Throws tandem::Error when the pieces do not cover a tensor
// exactly once or disagree on its dtype, shape or strides.
void write_manifest(const std::string& dir, const Identity& identity, const std::vector<std::string>& indexes);

// Reads the checkpoint directory `dir`. Throws DamagedCheckpoint, saying
// what is wrong, for anything that is not one whole checkpoint: a file
// missing, cut short, altered or of another checkpoint; a manifest that
// does not describe exactly the pieces the files' own sealed indexes hold
// (so an edited manifest either changes nothing or is refused).
AssembledCheckpoint read(const std::string& dir);

// Reads the checkpoint directory `dir` into `wanted` (Note [loading by
// overlap]): each piece's `data` (1-D, writable) is elements `offset` ..
// `offset + data.numel()` of the whole `shape` in the memory order of its
// `strides`, and is filled from the checkpoint's pieces that overlap it,
// whatever layout wrote them. `on_header` sees rank 0's header and the CPU
// generator's state before any piece is read (a settings check refuses
// there); `inspect` sees every piece of the checkpoint as it is read,
// wanted or not (name, data), so that every rank reaches the same verdict.
// Returns the names among `wanted` that the checkpoint does not hold.
// Throws DamagedCheckpoint as read() does, tandem::Error for a wanted
// tensor of another shape than the checkpoint's, and what the callbacks
// throw as they threw it.
using HeaderCheck = std::function<void(const std::map<std::string, c10::IValue>& header, const torch::Tensor& cpu_rng)>;
using PieceCheck = std::function<void(const std::string& name, const torch::Tensor& data)>;
std::set<std::string> read_into(const std::string& dir, std::vector<StatePiece>& wanted, const HeaderCheck& on_header,
                                const PieceCheck& inspect);

// The step a checkpoint directory's manifest names, or -1 when it has none
// that parses.
int64_t manifest_step(const std::string& dir);

}  // namespace sharded
}  // namespace tandem::checkpoint
