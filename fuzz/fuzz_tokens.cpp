// libFuzzer target: the token-file reader (llm.c's shards of either magic,
// nanoGPT's headerless uint16 files), then a few windows of the tokens.
#include <cstring>
#include <vector>

#include "fuzz_common.h"
#include "tandem/data/tokens.h"

namespace {

// An llm.c shard: the 256-int32 header, then `tokens` of `width` bytes.
std::vector<uint8_t> shard(int32_t magic, int32_t version, const std::vector<uint32_t>& tokens, int width) {
  std::vector<uint8_t> bytes(tandem::data::kLlmcHeaderBytes, 0);
  const int32_t header[3] = {magic, version, static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), header, sizeof header);
  for (uint32_t t : tokens) {
    for (int b = 0; b < width; ++b) bytes.push_back(static_cast<uint8_t>(t >> (8 * b)));
  }
  return bytes;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  auto dir = tandem::fuzz::seed_dir();
  if (dir.empty()) return 0;
  auto gpt2 = shard(tandem::data::kLlmcGpt2Magic, 1, {50256, 15496, 11, 995, 0, 50256}, 2);
  tandem::fuzz::write_bytes(dir + "/gpt2_train_000001.bin", gpt2.data(), gpt2.size());
  auto llama = shard(tandem::data::kLlmcLlama3Magic, 7, {128000, 9906, 11, 1917, 0}, 4);
  tandem::fuzz::write_bytes(dir + "/llama3_train_000001.bin", llama.data(), llama.size());
  const uint8_t nanogpt[] = {1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0};
  tandem::fuzz::write_bytes(dir + "/train.bin", nanogpt, sizeof nanogpt);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& path = tandem::fuzz::input_path();
  tandem::fuzz::write_bytes(path, data, size);
  for (int64_t vocab : {0, 300, 70000}) {  // the format's own, and two flags
    tandem::fuzz::expect_result_or_error([&] {
      auto stream = std::make_shared<const tandem::data::TokenStream>("tokens", std::vector<std::string>{path}, vocab);
      for (int64_t seq_len : {1, 3}) {
        if (stream->size() < seq_len + 1) continue;
        tandem::data::TokenDataset windows(stream, 0, stream->size(), seq_len, "fuzz");
        std::vector<int64_t> picks = {0, windows.size() - 1, windows.size() / 2};
        auto batch = windows.get_batch(picks, 0);
        if (batch.inputs.size(1) != seq_len) std::abort();
        (void)windows.content_digest();
      }
    });
  }
  return 0;
}
