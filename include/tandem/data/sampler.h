// tandem/data/sampler.h: which sample indices an epoch visits, in which order.
//
// Samplers are pure functions of (epoch) plus their construction arguments, so
// a resumed run, another worker count or another rank sees the same order.
#pragma once

#include <cstdint>
#include <vector>

namespace tandem::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // The indices of `epoch`, in visiting order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
  // How many indices each epoch yields.
  virtual int64_t size() const = 0;
};

// 0, 1, ..., n-1 every epoch (evaluation).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n) : n_(n) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
};

// A permutation drawn with torch.randperm from a CPU generator seeded with
// seed + epoch: the same order PyTorch's DistributedSampler(shuffle=True,
// seed=seed) gives a single process.
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {}
  std::vector<int64_t> indices(int64_t epoch) const override;
  int64_t size() const override { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

struct DistributedSamplerOptions {
  int64_t world_size = 1;  // number of ranks (num_replicas)
  int64_t rank = 0;
  bool shuffle = true;     // a permutation from seed + epoch, else 0..n-1
  uint64_t seed = 0;
  bool drop_last = false;  // drop the tail instead of padding to a multiple of world_size
};

// torch.utils.data.DistributedSampler, index for index: the (shuffled) order
// is padded by repeating its start up to a multiple of world_size (or cut
// down with drop_last), and rank r takes positions r, r + W, r + 2W, ...
// So every rank gets the same count, and the union of the ranks' k-th
// batches of B is the single-process k-th batch of W * B (up to order).
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t n, DistributedSamplerOptions options);
  std::vector<int64_t> indices(int64_t epoch) const override;
  // This rank's count per epoch (num_samples).
  int64_t size() const override { return num_samples_; }
  // Samples per epoch over all ranks (total_size).
  int64_t total_size() const { return num_samples_ * options_.world_size; }

 private:
  int64_t n_;
  DistributedSamplerOptions options_;
  int64_t num_samples_;
};

// Seed 004's DataPartitioner: the indices 0..n-1 shuffled once with `seed`
// (torch.randperm on a CPU generator), then cut into consecutive parts of
// floor(fraction * n) indices each. The parts are disjoint; fractions must be
// >= 0 and sum to at most 1 (a remainder is left out, as in seed 004).
std::vector<std::vector<int64_t>> partition_indices(int64_t n, const std::vector<double>& fractions,
                                                    uint64_t seed);

// Fixed indices, the same order every epoch (e.g. one partition).
class SubsetSampler : public Sampler {
 public:
  explicit SubsetSampler(std::vector<int64_t> indices) : indices_(std::move(indices)) {}
  std::vector<int64_t> indices(int64_t /*epoch*/) const override { return indices_; }
  int64_t size() const override { return static_cast<int64_t>(indices_.size()); }

 private:
  std::vector<int64_t> indices_;
};

}  // namespace tandem::data
