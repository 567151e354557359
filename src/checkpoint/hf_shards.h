// A transformers folder's weights as save_pretrained writes them: one
// model.safetensors, or shards under an index past max_shard_size.
#pragma once

#include <map>
#include <string>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint::internal {

// transformers' default max_shard_size, "5GB": 5 x 10^9 bytes.
inline constexpr double kDefaultShardBytes = 5e9;

// Note [weight shards]: the tensors, in order, into shards of at most
// `max_shard_bytes` each (a tensor larger than that alone in its own), as
// transformers' save_pretrained cuts them: one shard is
// model.safetensors; several are model-00001-of-0000N.safetensors with
// model.safetensors.index.json ({"metadata": {"total_size": bytes},
// "weight_map": {tensor: file}}). Every shard carries `metadata`, so
// tandem sample and eval read a sharded folder as a whole one. The files
// of the other form left by an earlier export are removed, so the folder
// holds one set of weights.
void write_weight_shards(const std::string& dir, const NamedTensors& tensors,
                         const std::map<std::string, std::string>& metadata, double max_shard_bytes);

}  // namespace tandem::checkpoint::internal
