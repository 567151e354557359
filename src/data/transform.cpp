#include "tandem/data/transform.h"

#include <cmath>

#include "tandem/util/check.h"
#include "transforms_internal.h"

namespace tandem::data {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

// SplitMix64's output function (Stafford's Mix13): a bijection of 64 bits
// with full avalanche.
uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

// The key (seed, epoch, index) is folded in one word at a time, each through
// a full mix, so that neighbouring keys give unrelated streams.
SampleRng::SampleRng(uint64_t seed, int64_t epoch, int64_t index) {
  uint64_t h = mix(seed + kGolden);
  h = mix(h ^ (static_cast<uint64_t>(epoch) + 2 * kGolden));
  h = mix(h ^ (static_cast<uint64_t>(index) + 3 * kGolden));
  state_ = h;
}

uint64_t SampleRng::next_u64() {
  state_ += kGolden;
  return mix(state_);
}

double SampleRng::uniform(double lo, double hi) {
  if (!(hi > lo)) return lo;
  double unit = static_cast<double>(next_u64() >> 11) * 0x1.0p-53;  // [0, 1), 53 bits
  double x = lo + unit * (hi - lo);
  return x < hi ? x : std::nextafter(hi, lo);  // rounding may reach hi
}

int64_t SampleRng::randint(int64_t lo, int64_t hi) {
  TANDEM_CHECK(lo <= hi, "SampleRng::randint: empty range [", lo, ", ", hi, "]");
  uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) + 1;  // 0: all 2^64
  if (range == 0) return static_cast<int64_t>(next_u64());
  // Lemire's multiply-and-reject: unbiased, one multiplication per try.
  uint64_t threshold = (0 - range) % range;
  while (true) {
    __uint128_t product = static_cast<__uint128_t>(next_u64()) * range;
    if (static_cast<uint64_t>(product) >= threshold) {
      return static_cast<int64_t>(static_cast<uint64_t>(lo) + static_cast<uint64_t>(product >> 64));
    }
  }
}

bool SampleRng::bernoulli(double p) { return uniform(0.0, 1.0) < p; }

Compose::Compose(std::vector<TransformPtr> transforms) : transforms_(std::move(transforms)) {
  for (size_t i = 0; i < transforms_.size(); ++i) {
    TANDEM_CHECK(transforms_[i] != nullptr, "Compose: transform ", i, " is null");
    warps_.push_back(dynamic_cast<const PackedWarp*>(transforms_[i].get()));
  }
}

// Note [packed warp chains].
torch::Tensor Compose::apply(const torch::Tensor& image, SampleRng& rng) const {
  torch::Tensor out = image;
  auto packs = [&](size_t k, int64_t channels) {
    return warps_[k] != nullptr && warps_[k]->warps_packed(channels);
  };
  // The channels of `out` when a packed run can start at transform k, else 0.
  auto run_at = [&](size_t k) -> int64_t {
    if (warps_[k] == nullptr || !out.defined() || out.dim() != 3 || out.scalar_type() != torch::kUInt8) {
      return 0;
    }
    int64_t channels = out.size(0);
    return detail::packs_pixels(channels) && packs(k, channels) ? channels : 0;
  };
  size_t i = 0;
  while (i < transforms_.size()) {
    int64_t channels = run_at(i);
    if (channels == 0) {
      out = transforms_[i++]->apply(out, rng);
      continue;
    }
    auto packed = detail::pack_pixels(out);
    while (i < transforms_.size() && packs(i, channels)) packed = warps_[i++]->apply_packed(packed, rng);
    out = detail::unpack_pixels(packed, channels);
  }
  return out;
}

// torchvision's multi-line repr: one transform per line, indented by four.
std::string Compose::describe() const {
  std::string out = "Compose(\n";
  for (const auto& t : transforms_) out += "    " + t->describe() + "\n";
  return out + ")";
}

}  // namespace tandem::data
