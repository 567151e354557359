#include "tandem/data/device_prefetcher.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace tandem::data {

namespace {
const c10::impl::DeviceGuardImplInterface& guard_impl(const c10::Stream& stream) {
  return *c10::impl::getDeviceGuardImpl(stream.device_type());
}
}  // namespace

DevicePrefetcher::DevicePrefetcher(std::unique_ptr<EpochIterator> batches, PrefetchOptions options)
    : batches_(std::move(batches)), options_(options) {
  if (!options_.device.is_cuda()) return;
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  auto device = options_.device.has_index() ? options_.device : impl->getDevice();
  side_ = impl->getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  queue_next();
}

DevicePrefetcher::~DevicePrefetcher() = default;

Batch DevicePrefetcher::to_device(Batch batch) const {
  if (batch.size() == 0) return batch;
  // Moved first, converted there: libtorch converts a host-to-device copy's
  // dtype on the host, synchronously.
  // Token ids stay integers whatever --dtype is.
  auto inputs = batch.inputs.to(options_.device, /*non_blocking=*/true);
  if (inputs.is_floating_point()) inputs = inputs.to(options_.input_dtype);
  if (options_.channels_last && inputs.dim() == 4) inputs = inputs.contiguous(torch::MemoryFormat::ChannelsLast);
  return {inputs, batch.targets.to(options_.device, /*non_blocking=*/true)};
}

// Note [prefetch stream]
void DevicePrefetcher::queue_next() {
  std::optional<Batch> host;
  try {
    host = batches_->next();
  } catch (...) {
    error_ = std::current_exception();  // thrown when its batch is asked for
    return;
  }
  if (!host) return;  // the end
  {
    c10::StreamGuard guard(*side_);
    queued_ = to_device(std::move(*host));
  }
  ready_.emplace(side_->device_type());
  ready_->record(*side_);
}

std::optional<Batch> DevicePrefetcher::next() {
  if (!side_) {  // the CPU: convert now, nothing ahead
    auto batch = batches_->next();
    if (!batch) return std::nullopt;
    return to_device(std::move(*batch));
  }
  if (!queued_) {
    if (error_) std::rethrow_exception(error_);
    return std::nullopt;
  }
  Batch batch = std::move(*queued_);
  queued_.reset();
  c10::Stream current = guard_impl(*side_).getStream(side_->device());
  ready_->block(current);
  if (batch.size() > 0) {
    batch.inputs.record_stream(current);
    batch.targets.record_stream(current);
  }
  queue_next();
  return batch;
}

}  // namespace tandem::data
