// What the writer and the reader of sharded checkpoints share
// (sharded_checkpoint.h): the format's name and version, and the checks of
// a tensor's pieces. Internal to src/checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tandem::checkpoint::sharded::internal {

constexpr const char* kFormat = "tandem sharded checkpoint";
constexpr int64_t kVersion = 1;

// The elements of a tensor of `shape`; throws tandem::Error naming `where`
// for a product past 2^48.
int64_t elements(const std::vector<int64_t>& shape, const std::string& where);

// Each of [offset, offset + numel) of `pieces` once, together 0 .. total;
// throws tandem::Error naming `name` and the first element overlapped or
// left out.
void check_cover(std::vector<std::pair<int64_t, int64_t>> pieces, int64_t total, const std::string& name);

}  // namespace tandem::checkpoint::sharded::internal
