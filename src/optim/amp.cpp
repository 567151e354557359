#include "tandem/optim/amp.h"

#include <ATen/autocast_mode.h>

#include "tandem/util/check.h"

namespace tandem::optim {

std::optional<torch::ScalarType> parse_amp(const std::string& text) {
  if (text == "off") return std::nullopt;
  if (text == "bf16") return torch::kBFloat16;
  if (text == "fp16") return torch::kHalf;
  TANDEM_FAIL("--amp: expected off, bf16 or fp16, got '", text, "'");
}

AutocastGuard::AutocastGuard(torch::DeviceType device_type, std::optional<torch::ScalarType> dtype)
    : device_type_(device_type) {
  if (!dtype) return;
  active_ = true;
  was_enabled_ = at::autocast::is_autocast_enabled(device_type_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_type_);
  at::autocast::set_autocast_enabled(device_type_, true);
  at::autocast::set_autocast_dtype(device_type_, *dtype);
  at::autocast::increment_nesting();
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // The outermost guard drops the casts it cached (weights cast once per
  // forward), as torch.autocast's __exit__ does.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, was_dtype_);
}

}  // namespace tandem::optim
