// Reading a tokenizer file (tokenizer.h).
#include "tandem/data/tokenizer.h"

#include <filesystem>

#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tokenizer_internal.h"

namespace tandem::data {

namespace internal {

void check_keys(const nlohmann::json& j, std::initializer_list<const char*> known, const std::string& where,
                const std::string& prefix) {
  TANDEM_CHECK_USAGE(j.is_object(), where, ": ", prefix.empty() ? "the file" : prefix.substr(0, prefix.size() - 1),
                     " must be a JSON object");
  for (const auto& [key, value] : j.items()) {
    bool ok = false;
    for (const char* k : known) ok = ok || key == k;
    TANDEM_CHECK_USAGE(ok, where, ": unknown key \"", prefix, key, "\" (tandem does not know what it changes)");
  }
}

std::string string_at(const nlohmann::json& j, const char* key, const std::string& where, const std::string& what) {
  TANDEM_CHECK_USAGE(j.is_object() && j.contains(key) && j[key].is_string(), where, ": ", what, ".", key,
                     " must be a string");
  return j[key].get<std::string>();
}

}  // namespace internal

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path, const std::string& flag) {
  std::error_code ec;
  TANDEM_CHECK_USAGE(std::filesystem::is_regular_file(path, ec), flag, " ", path,
                     ": no such file (a tokenizer.json, or a SentencePiece .model)");
  if (std::filesystem::path(path).extension() != ".json") return internal::sentencepiece_tokenizer(path, flag);
  const auto size = std::filesystem::file_size(path, ec);
  TANDEM_CHECK_USAGE(!ec && size <= (size_t(1) << 30), flag, " ", path, ": a tokenizer.json of at most 1 GiB");
  const auto text = read_regular_file(path, "a tokenizer.json");
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  TANDEM_CHECK_USAGE(!j.is_discarded(), flag, " ", path, ": not JSON");
  return internal::bpe_tokenizer(j, path, flag);
}

}  // namespace tandem::data
