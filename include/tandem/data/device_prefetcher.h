// tandem/data/device_prefetcher.h: batches moved to the training device one
// step ahead, on a side stream.
//
//   data::DevicePrefetcher batches(loader.epoch(e), {device, torch::kFloat32, channels_last});
//   while (auto batch = batches.next()) train(batch->inputs, batch->targets);
//
// Note [prefetch stream]: on a CUDA device, handing out batch k queues the
// host-to-device copy of batch k + 1 (from the loader's pinned memory, non
// blocking), its dtype conversion and its memory-format change on a side
// stream, so they overlap step k's kernels on the current stream. An event
// recorded after them on the side stream orders them: next() makes the
// current stream wait on that event before the batch is used, and records
// the batch's tensors as used by the current stream, so the caching
// allocator does not hand their memory to the side stream again before the
// step that reads them is done. The host never blocks on the device here.
// On the CPU there is no stream: next() converts the batch in place of the
// copy, and nothing runs ahead.
#pragma once

#include <memory>
#include <optional>

#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include "tandem/data/loader.h"

namespace tandem::data {

struct PrefetchOptions {
  torch::Device device = torch::kCPU;
  torch::ScalarType input_dtype = torch::kFloat32;  // floating inputs only: targets and token ids keep theirs (int64)
  bool channels_last = false;                       // 4-D inputs in NHWC memory order
};

class DevicePrefetcher {
 public:
  DevicePrefetcher(std::unique_ptr<EpochIterator> batches, PrefetchOptions options);
  ~DevicePrefetcher();
  DevicePrefetcher(const DevicePrefetcher&) = delete;
  DevicePrefetcher& operator=(const DevicePrefetcher&) = delete;

  // The next batch on options.device, ready for the current stream, or
  // nullopt at the end of the epoch. A loader error is rethrown here, at the
  // batch it belongs to.
  std::optional<Batch> next();

 private:
  Batch to_device(Batch batch) const;
  void queue_next();  // the following batch onto the side stream (CUDA)

  std::unique_ptr<EpochIterator> batches_;
  PrefetchOptions options_;
  std::optional<c10::Stream> side_;  // CUDA only
  std::optional<Batch> queued_;      // on the device, on its way
  std::optional<c10::Event> ready_;  // recorded after queued_'s copy
  std::exception_ptr error_;         // the loader's, for the batch after queued_
};

}  // namespace tandem::data
