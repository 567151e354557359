#include "tandem/launch/worker_error.h"

#include <cstdio>
#include <fstream>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "tandem/util/env.h"
#include "tandem/util/parse.h"

namespace tandem::launch {

namespace {
constexpr const char* kMagic = "tandem-worker-error 2";
constexpr const char* kMagicVersion1 = "tandem-worker-error 1";  // without the unanswered line
}  // namespace

std::string format_worker_error(const WorkerError& error) {
  std::ostringstream out;
  out << kMagic << "\ntime_ns " << error.time_ns << "\nfollows_peer " << (error.follows_peer ? 1 : 0)
      << "\nunanswered";
  for (int64_t rank : error.unanswered) out << " " << rank;
  out << "\n" << error.message;
  return out.str();
}

std::optional<WorkerError> parse_worker_error(const std::string& text) {
  std::istringstream in(text);
  std::string line;
  if (!std::getline(in, line) || (line != kMagic && line != kMagicVersion1)) return std::nullopt;
  const bool version1 = line == kMagicVersion1;
  WorkerError error;
  auto field = [&](const char* name, int64_t& value) {
    if (!std::getline(in, line)) return false;
    const std::string prefix = std::string(name) + " ";
    if (line.compare(0, prefix.size(), prefix) != 0) return false;
    const auto parsed = parse_int(line.substr(prefix.size()));
    if (parsed) value = *parsed;
    return parsed.has_value();
  };
  int64_t follows = 0;
  if (!field("time_ns", error.time_ns) || !field("follows_peer", follows) || (follows != 0 && follows != 1)) {
    return std::nullopt;
  }
  error.follows_peer = follows == 1;
  if (!version1) {
    if (!std::getline(in, line) || line.compare(0, 10, "unanswered") != 0) return std::nullopt;
    for (const auto& word : split(line.substr(10), ' ')) {
      if (word.empty()) continue;
      const auto rank = parse_int(word);
      if (!rank || *rank < 0) return std::nullopt;
      error.unanswered.push_back(*rank);
    }
  }
  std::ostringstream rest;
  rest << in.rdbuf();
  error.message = rest.str();
  return error;
}

namespace {

// Writes `text` to a temporary name and renames it to `path`, so that a
// reader never sees half a file. Best effort: the process is failing.
void write_whole(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp-" + std::to_string(getpid());
  std::FILE* f = std::fopen(temporary.c_str(), "w");
  if (f == nullptr) return;
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written || std::rename(temporary.c_str(), path.c_str()) != 0) {
    std::remove(temporary.c_str());
  }
}

}  // namespace

std::string torchelastic_error_json(const std::string& message, bool follows_peer, int64_t unix_seconds) {
  nlohmann::json j;
  j["message"]["message"] = message;
  j["message"]["extraInfo"]["py_callstack"] = message;  // what torchrun's summary shows as the traceback
  j["message"]["extraInfo"]["timestamp"] = std::to_string(follows_peer ? unix_seconds + 1 : unix_seconds);
  return j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
}

void report_worker_error(const std::string& message, bool follows_peer, const std::vector<int64_t>& unanswered) {
  if (const auto path = env::get(kTorchelasticErrorFileVariable); path && !path->empty()) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    write_whole(*path, torchelastic_error_json(message, follows_peer, now));
  }
  const auto variable = env::get(kErrorFileVariable);
  if (!variable || variable->empty()) return;
  WorkerError error;
  error.time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::steady_clock::now().time_since_epoch())
                      .count();
  error.follows_peer = follows_peer;
  error.unanswered = unanswered;
  error.message = message;
  write_whole(*variable, format_worker_error(error));
}

std::optional<WorkerError> read_worker_error(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream text;
  text << in.rdbuf();
  return parse_worker_error(text.str());
}

}  // namespace tandem::launch
