#include "tandem/parallel/bucket_plan.h"

#include <map>

#include "tandem/util/check.h"

namespace tandem::parallel {

std::vector<Bucket> plan_buckets(const std::vector<ParameterInfo>& parameters,
                                 const BucketOptions& options) {
  TANDEM_CHECK(options.first_bucket_bytes >= 1 && options.bucket_bytes >= 1,
               "bucket caps must be at least 1 byte, got ", options.first_bucket_bytes, " and ",
               options.bucket_bytes);
  std::vector<Bucket> buckets;
  std::map<std::string, size_t> open;    // kind -> index of its open bucket in `buckets`
  std::map<std::string, bool> had_first;  // kind -> its first bucket is closed
  for (size_t k = parameters.size(); k-- > 0;) {
    const auto& p = parameters[k];
    TANDEM_CHECK(p.bytes >= 0, "parameter ", k, " has a negative size");
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
  return buckets;
}

}  // namespace tandem::parallel
