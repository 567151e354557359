// Writing the files of a sharded checkpoint (sharded_checkpoint.h): each
// rank's pieces and rank 0's manifest. Reading them is sharded_read.cpp.
#include "tandem/checkpoint/sharded_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <unordered_map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "checkpoint_archive.h"
#include "sharded_internal.h"

namespace tandem::checkpoint::sharded {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using internal::kFormat;
using internal::kVersion;

struct TensorEntry {
  int64_t order = 0;
  std::string dtype;
  std::vector<int64_t> shape, strides;
  json pieces = json::array();
};

}  // namespace

namespace internal {

int64_t elements(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (auto d : shape) {
    TANDEM_CHECK(d == 0 || n <= (int64_t(1) << 48) / d, where, ": a shape of more than 2^48 elements");
    n *= d;
  }
  return n;
}

void check_cover(std::vector<std::pair<int64_t, int64_t>> pieces, int64_t total, const std::string& name) {
  std::sort(pieces.begin(), pieces.end());
  int64_t next = 0;
  for (const auto& [offset, numel] : pieces) {
    TANDEM_CHECK(offset == next, name, ": its pieces ", offset < next ? "overlap" : "leave a gap", " at element ",
                 std::min(offset, next));
    next = offset + numel;
  }
  TANDEM_CHECK(next == total, name, ": its pieces hold ", next, " of its ", total, " elements");
}

}  // namespace internal

std::string rank_file(int64_t rank) { return "rank-" + std::to_string(rank) + ".pt"; }

std::string write_rank_file(const std::string& dir, int64_t rank, const Identity& identity,
                            const std::vector<StatePiece>& pieces, const std::map<std::string, c10::IValue>& header,
                            bool with_rng) {
  torch::serialize::OutputArchive archive;
  archive.write("checkpoint_id", c10::IValue(identity.id));
  archive.write("rank", c10::IValue(rank));
  archive.write("ranks", c10::IValue(identity.ranks));
  archive.write("step", c10::IValue(identity.step));
  json index = json::array();
  // An archive holds each storage its tensors view whole, once: pieces
  // that view a storage they do not fill between them (a run of a larger
  // tensor) are copied, so that a file holds its pieces and no more.
  std::vector<torch::Tensor> data(pieces.size());
  std::unordered_map<const void*, int64_t> viewed;  // bytes of each storage the pieces view
  for (size_t i = 0; i < pieces.size(); ++i) {
    data[i] = pieces[i].data.detach().to(torch::kCPU).contiguous().reshape({-1});
    viewed[data[i].storage().unsafeGetStorageImpl()] += data[i].numel() * data[i].element_size();
  }
  for (auto& d : data) {
    if (viewed.at(d.storage().unsafeGetStorageImpl()) < static_cast<int64_t>(d.storage().nbytes())) d = d.clone();
  }
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    const std::string key = "p" + std::to_string(i);
    archive.write(key, data[i], /*is_buffer=*/true);
    index.push_back({{"name", p.name}, {"order", p.order}, {"dtype", c10::toString(data[i].scalar_type())},
                     {"shape", p.shape}, {"strides", p.strides}, {"offset", p.offset},
                     {"numel", data[i].numel()}, {"key", key}});
  }
  archive.write("index", c10::IValue(index.dump()));
  for (const auto& [key, value] : header) archive.write("h_" + key, value);
  if (with_rng) archive.write("cpu_rng", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  std::ostringstream zip;
  archive.save_to(zip);
  const std::string bytes = seal_checkpoint(zip.str());
  const std::string name = rank_file(rank);
  write_atomically((fs::path(dir) / name).string(),
                   [&](const std::string& tmp) { checkpoint::internal::write_file(tmp, bytes); });
  return json{{"file", name}, {"bytes", bytes.size()}, {"pieces", index}}.dump();
}

void write_manifest(const std::string& dir, const Identity& identity, const std::vector<std::string>& indexes) {
  json files = json::array();
  std::map<std::string, TensorEntry> tensors;
  for (const auto& text : indexes) {
    const json index = json::parse(text);
    files.push_back({{"file", index.at("file")}, {"bytes", index.at("bytes")}});
    for (const auto& piece : index.at("pieces")) {
      const std::string name = piece.at("name");
      auto [entry, fresh] = tensors.try_emplace(name);
      auto& t = entry->second;
      if (fresh) {
        t.order = piece.at("order");
        t.dtype = piece.at("dtype");
        t.shape = piece.at("shape").get<std::vector<int64_t>>();
        t.strides = piece.at("strides").get<std::vector<int64_t>>();
      }
      TANDEM_CHECK(t.dtype == piece.at("dtype") && t.shape == piece.at("shape").get<std::vector<int64_t>>() &&
                       t.strides == piece.at("strides").get<std::vector<int64_t>>(),
                   "sharded checkpoint: the ranks disagree on ", name, "'s dtype, shape or strides");
      t.pieces.push_back({{"file", index.at("file")}, {"key", piece.at("key")}, {"offset", piece.at("offset")},
                          {"numel", piece.at("numel")}});
    }
  }
  std::vector<std::pair<std::string, const TensorEntry*>> ordered;
  for (const auto& [name, t] : tensors) {
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const auto& p : t.pieces) spans.emplace_back(p.at("offset"), p.at("numel"));
    internal::check_cover(spans, internal::elements(t.shape, name), "sharded checkpoint: " + name);
    ordered.emplace_back(name, &t);
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second->order < b.second->order; });
  json list = json::array();
  for (const auto& [name, t] : ordered) {
    list.push_back({{"name", name}, {"dtype", t->dtype}, {"shape", t->shape}, {"strides", t->strides},
                    {"pieces", t->pieces}});
  }
  const json manifest{{"format", kFormat},        {"version", kVersion},         {"id", identity.id},
                      {"ranks", identity.ranks}, {"step", identity.step}, {"files", files},
                      {"tensors", list}};
  const std::string text = manifest.dump(1) + "\n";
  write_atomically((fs::path(dir) / kManifest).string(),
                   [&](const std::string& tmp) { checkpoint::internal::write_file(tmp, text); });
}

int64_t manifest_step(const std::string& dir) {
  try {
    const json manifest = json::parse(read_regular_file((fs::path(dir) / kManifest).string(), "a manifest"));
    return manifest.at("step").get<int64_t>();
  } catch (const std::exception&) {
    return -1;
  }
}

}  // namespace tandem::checkpoint::sharded
