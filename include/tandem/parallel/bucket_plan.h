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
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::parallel {

struct BucketOptions {
  int64_t first_bucket_bytes = int64_t(1) << 20;  // 1 MiB
  int64_t bucket_bytes = int64_t(25) << 20;       // 25 MiB
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
// byte.
std::vector<Bucket> plan_buckets(const std::vector<ParameterInfo>& parameters,
                                 const BucketOptions& options = {});

}  // namespace tandem::parallel
