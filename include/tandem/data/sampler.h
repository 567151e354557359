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

}  // namespace tandem::data
