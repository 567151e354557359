#include "tandem/data/sampler.h"

#include <numeric>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

namespace tandem::data {

std::vector<int64_t> SequentialSampler::indices(int64_t /*epoch*/) const {
  std::vector<int64_t> out(n_);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed_ + static_cast<uint64_t>(epoch));
  auto permutation = torch::randperm(n_, generator, torch::kInt64);
  const int64_t* data = permutation.data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + n_);
}

}  // namespace tandem::data
