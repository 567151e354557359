#include "tandem/data/sampler.h"

#include <algorithm>
#include <numeric>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::data {

std::vector<int64_t> SequentialSampler::indices(int64_t /*epoch*/) const {
  std::vector<int64_t> out(n_);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

namespace {
// torch.randperm(n, generator=torch.Generator().manual_seed(seed)).
std::vector<int64_t> permutation(int64_t n, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto perm = torch::randperm(n, generator, torch::kInt64);
  const int64_t* data = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + n);
}
}  // namespace

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return permutation(n_, seed_ + static_cast<uint64_t>(epoch));
}

DistributedSampler::DistributedSampler(int64_t n, DistributedSamplerOptions options)
    : n_(n), options_(options) {
  const int64_t w = options_.world_size;
  TANDEM_CHECK(w >= 1, "DistributedSampler: world size must be >= 1, got ", w);
  TANDEM_CHECK(options_.rank >= 0 && options_.rank < w, "DistributedSampler: rank ",
               options_.rank, " is outside [0, ", w, ")");
  TANDEM_CHECK(n >= 0, "DistributedSampler: negative data set size ", n);
  // As torch: with drop_last and a remainder, ceil((n - W) / W), else ceil(n / W).
  if (options_.drop_last && n % w != 0) {
    num_samples_ = n >= w ? (n - w + w - 1) / w : 0;
  } else {
    num_samples_ = (n + w - 1) / w;
  }
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = permutation(n_, options_.seed + static_cast<uint64_t>(epoch));
  } else {
    order.resize(n_);
    std::iota(order.begin(), order.end(), 0);
  }
  const int64_t total = total_size();
  if (static_cast<int64_t>(order.size()) < total) {
    // Pad by repeating the order from its start, as often as needed.
    TANDEM_CHECK(!order.empty(), "DistributedSampler: cannot pad an empty data set to ", total);
    int64_t original = static_cast<int64_t>(order.size());
    for (int64_t i = 0; static_cast<int64_t>(order.size()) < total; ++i) order.push_back(order[i % original]);
  } else {
    order.resize(total);
  }
  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = options_.rank; i < total; i += options_.world_size) mine.push_back(order[i]);
  return mine;
}

std::vector<std::vector<int64_t>> partition_indices(int64_t n, const std::vector<double>& fractions,
                                                    uint64_t seed) {
  double sum = 0;
  for (double f : fractions) {
    TANDEM_CHECK(f >= 0, "partition: fractions must be >= 0, got ", f);
    sum += f;
  }
  TANDEM_CHECK(sum <= 1 + 1e-9, "partition: fractions sum to ", sum, ", more than 1");
  auto order = permutation(n, seed);
  std::vector<std::vector<int64_t>> parts;
  size_t start = 0;
  for (double f : fractions) {
    auto length = static_cast<size_t>(f * static_cast<double>(n));  // int(frac * n), as seed 004
    length = std::min(length, order.size() - start);
    parts.emplace_back(order.begin() + start, order.begin() + start + length);
    start += length;
  }
  return parts;
}

}  // namespace tandem::data
