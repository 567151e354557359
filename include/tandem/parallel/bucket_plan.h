// tandem/parallel/bucket_plan.h: which gradients are all-reduced together.
//
// DDP reduces gradients in buckets: one collective per bucket instead of one
// per parameter, started as soon as the bucket's last gradient is ready, so
// that communication overlaps the rest of the backward pass. The plan is a
// pure function of the parameters' sizes, kinds and order, kept apart from
// the hooks that execute it so that it can be tested without processes.
//
// Rules (those of PyTorch's compute_bucket_assignment_by_size):
//  - parameters are taken in reverse registration order, roughly the order
//    in which backward produces their gradients;
//  - a bucket holds one kind (dtype and device) of tensor; each kind fills
//    its own open bucket;
//  - a parameter joins its kind's open bucket, which is closed once it holds
//    at least the current cap: first_bucket_bytes for the first bucket of a
//    kind (small, so the first all-reduce starts early), bucket_bytes after;
//    so a bucket exceeds its cap by less than its last parameter;
//  - buckets are numbered in the order their first parameter was taken, the
//    order every rank launches their reductions in.
// One rule of tandem's own on top (Note [small last bucket]):
//  - the first registered parameters of each kind, whose gradients backward
//    produces last, form a bucket of their own, closed once it holds at least
//    last_bucket_bytes, which is numbered after every other bucket. 0 turns
//    this off, which gives PyTorch's plan.
//
// Note [small last bucket]: nothing is left to overlap the reduction of the
// bucket that backward completes last: it starts when backward ends and the
// step waits for all of it. Under PyTorch's rules that bucket is whatever
// the cap leaves over, up to 25 MiB (8.3 MiB for resnet18: layer3 down to
// the stem), and the reductions queued before it wait too. With a last
// bucket of about 1 MiB, the larger bucket before it closes as soon as its
// own gradients are ready, while backward still has the first layers to go
// (for resnet18 on 32 px images, layer1 and the stem: a quarter of the
// backward pass), so only about 1 MiB is left exposed. Measured in
// bench/results/ddp.md ("Small last bucket").
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::parallel {

struct BucketOptions {
  int64_t first_bucket_bytes = int64_t(1) << 20;  // 1 MiB
  int64_t bucket_bytes = int64_t(25) << 20;       // 25 MiB
  int64_t last_bucket_bytes = int64_t(1) << 20;   // 1 MiB; 0: none (PyTorch's plan)
};

struct ParameterInfo {
  int64_t bytes = 0;  // numel * element size
  std::string kind;   // dtype and device, e.g. "float32 cpu"
};

struct Bucket {
  std::vector<size_t> parameters;  // indices into the input, in the order taken
  int64_t bytes = 0;
  std::string kind;
};

// `parameters` in registration order. Throws tandem::Error for a cap below 1
// byte (a negative last_bucket_bytes).
std::vector<Bucket> plan_buckets(const std::vector<ParameterInfo>& parameters,
                                 const BucketOptions& options = {});

}  // namespace tandem::parallel
