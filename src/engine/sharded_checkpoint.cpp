// The files of a sharded checkpoint (sharded_checkpoint.h): each rank's
// pieces, rank 0's manifest, and the whole tensors read back from them.
#include "tandem/engine/sharded_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tandem/engine/atomic_file.h"
#include "tandem/engine/checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "checkpoint_archive.h"

namespace tandem::engine::sharded {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "tandem sharded checkpoint";
constexpr int64_t kVersion = 1;

torch::ScalarType parse_dtype(const std::string& name) {
  for (int i = 0; i < static_cast<int>(torch::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<torch::ScalarType>(i);
    if (name == c10::toString(type)) return type;
  }
  TANDEM_FAIL("an unknown dtype '", name, "'");
}

// A field of `object` of JSON type `kind`, or an error naming `where`.
const json& field(const json& object, const char* key, json::value_t kind, const std::string& where) {
  TANDEM_CHECK(object.is_object() && object.contains(key), where, ": no \"", key, "\"");
  const json& value = object.at(key);
  const bool number = kind == json::value_t::number_integer &&
                      (value.type() == json::value_t::number_unsigned || value.type() == json::value_t::number_integer);
  TANDEM_CHECK(number || value.type() == kind, where, ": \"", key, "\" is ", value.type_name());
  return value;
}
int64_t integer(const json& object, const char* key, const std::string& where) {
  const json& value = field(object, key, json::value_t::number_integer, where);
  TANDEM_CHECK(value.is_number_integer() && value.get<int64_t>() >= 0, where, ": \"", key,
               "\" is not a count (", value.dump(), ")");
  return value.get<int64_t>();
}
std::vector<int64_t> integers(const json& object, const char* key, const std::string& where) {
  std::vector<int64_t> out;
  for (const auto& v : field(object, key, json::value_t::array, where)) {
    TANDEM_CHECK(v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() < (int64_t(1) << 48), where,
                 ": \"", key, "\" holds ", v.dump(), ", not a size");
    out.push_back(v.get<int64_t>());
  }
  return out;
}

// The elements of a tensor of `shape`, refusing a product past 2^48.
int64_t elements(const std::vector<int64_t>& shape, const std::string& where) {
  int64_t n = 1;
  for (auto d : shape) {
    TANDEM_CHECK(d == 0 || n <= (int64_t(1) << 48) / d, where, ": a shape of more than 2^48 elements");
    n *= d;
  }
  return n;
}

// Each of [offset, offset + numel) of `pieces` once, together 0 .. total.
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

struct TensorEntry {
  int64_t order = 0;
  std::string dtype;
  std::vector<int64_t> shape, strides;
  json pieces = json::array();
};

}  // namespace

std::string rank_file(int64_t rank) { return "rank-" + std::to_string(rank) + ".pt"; }

std::string write_rank_file(const std::string& dir, int64_t rank, const std::vector<StatePiece>& pieces,
                            const std::map<std::string, c10::IValue>& header, bool with_rng) {
  torch::serialize::OutputArchive archive;
  json index = json::array();
  for (size_t i = 0; i < pieces.size(); ++i) {
    const auto& p = pieces[i];
    const std::string key = "p" + std::to_string(i);
    auto data = p.data.detach().to(torch::kCPU).contiguous().reshape({-1});
    archive.write(key, data, /*is_buffer=*/true);
    index.push_back({{"name", p.name}, {"order", p.order}, {"dtype", c10::toString(data.scalar_type())},
                     {"shape", p.shape}, {"strides", p.strides}, {"offset", p.offset},
                     {"numel", data.numel()}, {"key", key}});
  }
  archive.write("index", c10::IValue(index.dump()));
  for (const auto& [key, value] : header) archive.write("h_" + key, value);
  if (with_rng) archive.write("cpu_rng", at::detail::getDefaultCPUGenerator().get_state(), /*is_buffer=*/true);
  std::ostringstream zip;
  archive.save_to(zip);
  const std::string bytes = seal_checkpoint(zip.str());
  const std::string name = rank_file(rank);
  write_atomically((fs::path(dir) / name).string(),
                   [&](const std::string& tmp) { internal::write_file(tmp, bytes); });
  return json{{"file", name}, {"bytes", bytes.size()}, {"pieces", index}}.dump();
}

void write_manifest(const std::string& dir, int64_t step, const std::vector<std::string>& indexes) {
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
    check_cover(spans, elements(t.shape, name), "sharded checkpoint: " + name);
    ordered.emplace_back(name, &t);
  }
  std::stable_sort(ordered.begin(), ordered.end(),
                   [](const auto& a, const auto& b) { return a.second->order < b.second->order; });
  json list = json::array();
  for (const auto& [name, t] : ordered) {
    list.push_back({{"name", name}, {"dtype", t->dtype}, {"shape", t->shape}, {"strides", t->strides},
                    {"pieces", t->pieces}});
  }
  const json manifest{{"format", kFormat}, {"version", kVersion}, {"step", step}, {"files", files}, {"tensors", list}};
  const std::string text = manifest.dump(1) + "\n";
  write_atomically((fs::path(dir) / kManifest).string(),
                   [&](const std::string& tmp) { internal::write_file(tmp, text); });
}

int64_t manifest_step(const std::string& dir) {
  try {
    const json manifest = json::parse(read_regular_file((fs::path(dir) / kManifest).string(), "a manifest"));
    return manifest.at("step").get<int64_t>();
  } catch (const std::exception&) {
    return -1;
  }
}

AssembledCheckpoint read(const std::string& dir) {
  const std::string manifest_path = (fs::path(dir) / kManifest).string();
  json manifest;
  try {
    manifest = json::parse(read_regular_file(manifest_path, "a checkpoint manifest"));
  } catch (const std::exception& e) {
    throw DamagedCheckpoint(std::string("damaged: ") + kManifest + ": " + e.what());
  }
  const std::string where = kManifest;
  TANDEM_CHECK(manifest.is_object() && manifest.value("format", "") == kFormat, where, ": not a manifest of a ", kFormat);
  TANDEM_CHECK(integer(manifest, "version", where) == kVersion, where, ": version ", manifest.at("version").dump(),
               ", expected ", kVersion);
  // Every file's pieces, by key, as its own (sealed) index describes them.
  struct Piece {
    json meta;
    torch::Tensor data;
  };
  std::map<std::string, std::map<std::string, Piece>> files;
  AssembledCheckpoint out;
  static const std::regex file_name(R"(rank-\d{1,9}\.pt)");
  for (const auto& f : field(manifest, "files", json::value_t::array, where)) {
    const std::string name = field(f, "file", json::value_t::string, where).get<std::string>();
    TANDEM_CHECK(std::regex_match(name, file_name), where, ": a file named '", printable(name),
                 "'; expected rank-<r>.pt");
    TANDEM_CHECK(!files.count(name), where, ": ", name, " is listed twice");
    std::string bytes;
    try {
      bytes = internal::verified_archive((fs::path(dir) / name).string());
    } catch (const tandem::Error& e) {  // "damaged: rank-1.pt: what", without the path twice
      std::string what = e.what();
      const std::string path = (fs::path(dir) / name).string() + ": ";
      if (what.rfind(path, 0) == 0) what = what.substr(path.size());
      if (what.rfind("damaged: ", 0) == 0) what = what.substr(9);
      throw DamagedCheckpoint("damaged: " + name + ": " + what);
    }
    torch::serialize::InputArchive archive;
    internal::load_checked_archive(bytes, archive);
    c10::IValue text;
    archive.read("index", text);
    auto& pieces = files[name];
    for (const auto& meta : json::parse(text.toStringRef())) {
      Piece piece{meta, {}};
      archive.read(meta.at("key").get<std::string>(), piece.data, /*is_buffer=*/true);
      pieces[meta.at("key").get<std::string>()] = std::move(piece);
    }
    if (name == rank_file(0)) {
      for (const auto& key : archive.keys()) {
        if (key.rfind("h_", 0) != 0) continue;
        archive.read(key, out.header[key.substr(2)]);
      }
      archive.read("cpu_rng", out.cpu_rng, /*is_buffer=*/true);
    }
  }
  TANDEM_CHECK(files.count(rank_file(0)), where, ": no ", rank_file(0), " (the position and settings)");
  for (const auto& t : field(manifest, "tensors", json::value_t::array, where)) {
    const std::string name = field(t, "name", json::value_t::string, where).get<std::string>();
    const std::string about = where + ": " + name;
    const auto dtype = parse_dtype(field(t, "dtype", json::value_t::string, about).get<std::string>());
    const auto shape = integers(t, "shape", about), strides = integers(t, "strides", about);
    TANDEM_CHECK(shape.size() == strides.size(), about, ": ", shape.size(), " sizes but ", strides.size(), " strides");
    const int64_t total = elements(shape, about);
    std::vector<std::pair<int64_t, int64_t>> spans;
    std::vector<const torch::Tensor*> data;
    for (const auto& p : field(t, "pieces", json::value_t::array, about)) {
      const std::string file = field(p, "file", json::value_t::string, about).get<std::string>();
      const std::string key = field(p, "key", json::value_t::string, about).get<std::string>();
      const int64_t offset = integer(p, "offset", about), numel = integer(p, "numel", about);
      auto in = files.find(file);
      TANDEM_CHECK(in != files.end() && in->second.count(key), about, ": a piece ", key, " of ", file,
                   ", which the manifest's files do not hold");
      const auto& piece = in->second.at(key);
      TANDEM_CHECK(piece.meta.value("name", "") == name && piece.meta.value("offset", int64_t(-1)) == offset &&
                       piece.data.dim() == 1 && piece.data.numel() == numel && piece.data.scalar_type() == dtype &&
                       offset <= total && numel <= total - offset,
                   about, ": piece ", key, " of ", file, " is not what the manifest says (", piece.meta.dump(), ")");
      spans.emplace_back(offset, numel);
      data.push_back(&piece.data);
    }
    check_cover(spans, total, about);  // before allocating what the manifest claims
    auto flat = torch::empty({total}, torch::TensorOptions().dtype(dtype));
    for (size_t i = 0; i < spans.size(); ++i) flat.narrow(0, spans[i].first, spans[i].second).copy_(*data[i]);
    int64_t reach = total > 0 ? 1 : 0;
    bool overflow = false;
    for (size_t d = 0; d < shape.size() && total > 0 && !overflow; ++d) {
      int64_t span = 0;
      overflow = __builtin_mul_overflow(shape[d] - 1, strides[d], &span) || __builtin_add_overflow(reach, span, &reach);
    }
    TANDEM_CHECK(!overflow && reach <= total, about, ": strides ", c10::IntArrayRef(strides), " reach past its ", total, " elements");
    auto whole = flat.as_strided(shape, strides);
    TANDEM_CHECK(total == 0 || whole.is_non_overlapping_and_dense(), about, ": strides ", c10::IntArrayRef(strides),
                 " are not a dense order of its elements");
    out.tensors.emplace_back(name, whole.contiguous());
  }
  return out;
}

}  // namespace tandem::engine::sharded
