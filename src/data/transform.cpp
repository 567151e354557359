#include "tandem/data/transform.h"

#include <cmath>

#include "tandem/data/transforms.h"
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
    identity_.push_back(transforms_[i]->is_identity());
  }
  // Note [tabulated finish]: the first ToTensor, and a Normalize after it.
  size_t k = 0;
  while (k < transforms_.size() && dynamic_cast<const ToTensor*>(transforms_[k].get()) == nullptr) ++k;
  if (k == transforms_.size()) return;
  size_t end = k + 1;
  while (end < transforms_.size() && identity_[end]) ++end;
  const auto* normalize = end < transforms_.size()
                              ? dynamic_cast<const Normalize*>(transforms_[end].get())
                              : nullptr;
  int64_t tables = normalize ? static_cast<int64_t>(normalize->options().mean.size()) : 1;
  auto ramp = torch::arange(256, torch::kInt32).to(torch::kUInt8).view({1, 1, 256}).repeat({tables, 1, 1});
  SampleRng unused(0, 0, 0);  // neither draws
  auto values = transforms_[k]->apply(ramp, unused);
  if (normalize) values = normalize->apply(values, unused);
  finish_tables_ = values.reshape({tables, 256}).contiguous();
  finish_begin_ = k;
  finish_end_ = normalize ? end + 1 : k + 1;
  // apply_into writes the finish into its target only when nothing after it
  // could hand back a view of it (a crop, a permutation) instead of itself.
  finish_last_ = true;
  for (size_t j = finish_end_; j < transforms_.size(); ++j) finish_last_ = finish_last_ && identity_[j];
}

torch::Tensor Compose::finish(const torch::Tensor& image, int64_t channels, bool packed,
                              const torch::Tensor& into) const {
  const int64_t tables = finish_tables_.size(0);
  if ((tables != 1 && tables != channels) || !image.device().is_cpu()) return {};
  const float* first = finish_tables_.data_ptr<float>();
  std::vector<const float*> rows;
  for (int64_t c = 0; c < channels; ++c) rows.push_back(first + 256 * (tables == 1 ? 0 : c));
  const int64_t height = image.size(1), width = image.size(2);
  bool fits = finish_last_ && into.defined() && into.device().is_cpu() && into.scalar_type() == torch::kFloat32 &&
              into.is_contiguous() && into.sizes() == torch::IntArrayRef{channels, height, width};
  auto out = fits ? into : torch::empty({channels, height, width}, torch::kFloat32);
  if (packed) {
    auto values = image.contiguous();
    detail::tabulate_packed_into(values.data_ptr<float>(), height * width, channels, rows.data(),
                                 out.data_ptr<float>());
  } else {
    detail::tabulate_pixels_into(detail::pixel_view(image), rows.data(), out.data_ptr<float>());
  }
  return out;
}

torch::Tensor Compose::apply(const torch::Tensor& image, SampleRng& rng) const {
  return run(image, rng, {});
}

torch::Tensor Compose::apply_into(const torch::Tensor& image, SampleRng& rng,
                                  const torch::Tensor& into) const {
  return run(image, rng, into);
}

// Note [packed warp chains], Note [tabulated finish].
torch::Tensor Compose::run(const torch::Tensor& image, SampleRng& rng, const torch::Tensor& into) const {
  torch::Tensor out = image;
  const size_t n = transforms_.size();
  auto packs = [&](size_t k, int64_t channels) {
    return identity_[k] || (warps_[k] != nullptr && warps_[k]->warps_packed(channels));
  };
  auto uint8_image = [&] {
    return out.defined() && out.dim() == 3 && out.scalar_type() == torch::kUInt8;
  };
  // The channels of `out` when a packed run can start at transform k, else 0.
  auto run_at = [&](size_t k) -> int64_t {
    if (warps_[k] == nullptr || !uint8_image()) return 0;
    int64_t channels = out.size(0);
    return detail::packs_pixels(channels) && packs(k, channels) ? channels : 0;
  };
  size_t i = 0;
  while (i < n) {
    if (identity_[i]) {
      ++i;
    } else if (i == finish_begin_ && uint8_image()) {
      auto finished = finish(out, out.size(0), /*packed=*/false, into);
      if (finished.defined()) {
        out = finished;
        i = finish_end_;
      } else {
        out = transforms_[i++]->apply(out, rng);
      }
    } else if (int64_t channels = run_at(i); channels > 0) {
      auto packed = detail::pack_pixels(out);
      while (i < n && packs(i, channels)) {
        if (!identity_[i]) packed = warps_[i]->apply_packed(packed, rng);
        ++i;
      }
      torch::Tensor finished;
      if (i == finish_begin_) finished = finish(packed, channels, /*packed=*/true, into);
      if (finished.defined()) {
        out = finished;
        i = finish_end_;
      } else {
        out = detail::unpack_pixels(packed, channels);
      }
    } else {
      out = transforms_[i++]->apply(out, rng);
    }
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
