#include "tandem/parallel/bucket_plan.h"

#include <algorithm>
#include <map>

#include "tandem/util/check.h"

namespace tandem::parallel {

std::vector<Bucket> plan_buckets(const std::vector<ParameterInfo>& parameters,
                                 const BucketOptions& options) {
  TANDEM_CHECK(options.first_bucket_bytes >= 1 && options.bucket_bytes >= 1,
               "bucket caps must be at least 1 byte, got ", options.first_bucket_bytes, " and ",
               options.bucket_bytes);
  TANDEM_CHECK(options.last_bucket_bytes >= 0, "the last bucket's cap must be >= 0 bytes, got ",
               options.last_bucket_bytes);
  for (size_t k = 0; k < parameters.size(); ++k) {
    TANDEM_CHECK(parameters[k].bytes >= 0, "parameter ", k, " has a negative size");
  }
  // Note [small last bucket]: each kind's first parameters, in registration
  // order, until they hold at least last_bucket_bytes; none when that takes
  // every parameter of the kind (one bucket would hold them anyway).
  std::vector<bool> in_last(parameters.size(), false);
  std::map<std::string, Bucket> last;  // kind -> its last bucket
  if (options.last_bucket_bytes > 0) {
    std::map<std::string, size_t> left;  // kind -> its parameters not taken
    for (const auto& p : parameters) ++left[p.kind];
    for (size_t k = 0; k < parameters.size(); ++k) {
      Bucket& bucket = last[parameters[k].kind];
      if (bucket.bytes >= options.last_bucket_bytes) continue;  // closed
      bucket.parameters.push_back(k);
      bucket.bytes += parameters[k].bytes;
      bucket.kind = parameters[k].kind;
      --left[bucket.kind];
    }
    for (auto& [kind, bucket] : last) {
      if (left[kind] == 0) bucket.parameters.clear();  // the kind's only bucket: planned below
      std::reverse(bucket.parameters.begin(), bucket.parameters.end());  // backward's order
      for (size_t k : bucket.parameters) in_last[k] = true;
    }
  }
  std::vector<Bucket> buckets;
  std::map<std::string, size_t> open;    // kind -> index of its open bucket in `buckets`
  std::map<std::string, bool> had_first;  // kind -> its first bucket is closed
  for (size_t k = parameters.size(); k-- > 0;) {
    if (in_last[k]) continue;
    const auto& p = parameters[k];
    auto it = open.find(p.kind);
    if (it == open.end()) {
      buckets.push_back(Bucket{{}, 0, p.kind});
      it = open.emplace(p.kind, buckets.size() - 1).first;
    }
    Bucket& bucket = buckets[it->second];
    bucket.parameters.push_back(k);
    bucket.bytes += p.bytes;
    int64_t cap = had_first[p.kind] ? options.bucket_bytes : options.first_bucket_bytes;
    if (bucket.bytes >= cap) {
      open.erase(it);
      had_first[p.kind] = true;
    }
  }
  // The last buckets go after every other one, in the order backward meets
  // their first parameters.
  for (size_t k = parameters.size(); k-- > 0;) {
    auto it = last.find(parameters[k].kind);
    if (!in_last[k] || it == last.end()) continue;
    buckets.push_back(std::move(it->second));
    last.erase(it);
  }
  return buckets;
}

}  // namespace tandem::parallel
