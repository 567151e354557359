// The files of a sharded checkpoint (sharded_checkpoint.h): each rank's
// pieces, rank 0's manifest, and the whole tensors read back from them.
#include "tandem/checkpoint/sharded_checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "checkpoint_archive.h"

namespace tandem::checkpoint::sharded {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = "tandem sharded checkpoint";
constexpr int64_t kVersion = 1;

torch::ScalarType parse_dtype(const std::string& name, const std::string& where) {
  for (int i = 0; i < static_cast<int>(torch::ScalarType::NumOptions); ++i) {
    const auto type = static_cast<torch::ScalarType>(i);
    if (name == c10::toString(type)) return type;
  }
  TANDEM_FAIL(where, ": an unknown dtype '", printable(name), "'");
}

// A field of `object` of JSON type `kind`, or an error naming `where`.
const json& field(const json& object, const char* key, json::value_t kind, const std::string& where) {
  TANDEM_CHECK(object.is_object() && object.contains(key), where, ": no \"", key, "\"");
  const json& value = object.at(key);
  const bool number = kind == json::value_t::number_integer &&
                      (value.type() == json::value_t::number_unsigned || value.type() == json::value_t::number_integer);
  TANDEM_CHECK(number || value.type() == kind, where, ": \"", key, "\" is ", value.type_name(), ", expected ",
               kind == json::value_t::number_integer ? "an integer" : json(kind).type_name());
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

std::string write_rank_file(const std::string& dir, int64_t rank, const Identity& identity,
                            const std::vector<StatePiece>& pieces, const std::map<std::string, c10::IValue>& header,
                            bool with_rng) {
  torch::serialize::OutputArchive archive;
  archive.write("checkpoint_id", c10::IValue(identity.id));
  archive.write("rank", c10::IValue(rank));
  archive.write("ranks", c10::IValue(identity.ranks));
  archive.write("step", c10::IValue(identity.step));
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
  const json manifest{{"format", kFormat},        {"version", kVersion},         {"id", identity.id},
                      {"ranks", identity.ranks}, {"step", identity.step}, {"files", files},
                      {"tensors", list}};
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

namespace {

// A rank file's own record of itself and its pieces (sealed with it).
struct RankFile {
  std::map<std::string, json> index;  // by key
  std::map<std::string, torch::Tensor> data;
  std::set<std::string> used;  // keys the manifest refers to
};

AssembledCheckpoint read_checked(const std::string& dir) {
  const std::string where = kManifest;
  json manifest;
  try {
    manifest = json::parse(read_regular_file((fs::path(dir) / kManifest).string(), "a checkpoint manifest"));
  } catch (const json::exception& e) {
    TANDEM_FAIL(where, ": not valid JSON (", e.what(), ")");
  } catch (const tandem::Error& e) {  // "manifest.json: what", without the folder's path again
    std::string what = e.what();
    const std::string path = (fs::path(dir) / kManifest).string() + ": ";
    TANDEM_FAIL(where, ": ", what.rfind(path, 0) == 0 ? what.substr(path.size()) : what);
  }
  TANDEM_CHECK(manifest.is_object() && manifest.value("format", "") == kFormat, where, ": not a manifest of a ", kFormat);
  TANDEM_CHECK(integer(manifest, "version", where) == kVersion, where, ": version ", manifest.at("version").dump(),
               ", expected ", kVersion);
  const std::string id = field(manifest, "id", json::value_t::string, where).get<std::string>();
  const int64_t ranks = integer(manifest, "ranks", where), step = integer(manifest, "step", where);
  const auto& listed = field(manifest, "files", json::value_t::array, where);
  TANDEM_CHECK(ranks >= 1 && static_cast<int64_t>(listed.size()) == ranks, where, ": its \"files\" list ",
               listed.size(), " file(s) but its \"ranks\" is ", ranks,
               " (the writing job's, one file per rank expected)");
  AssembledCheckpoint out;
  std::map<std::string, RankFile> files;
  for (int64_t r = 0; r < ranks; ++r) {
    const std::string name = rank_file(r);
    TANDEM_CHECK(field(listed[static_cast<size_t>(r)], "file", json::value_t::string, where) == name, where,
                 ": file ", r, " is ", listed[static_cast<size_t>(r)].at("file").dump(), ", expected ", name);
    std::string bytes;
    try {
      bytes = internal::verified_archive((fs::path(dir) / name).string());
    } catch (const tandem::Error& e) {  // "rank-1.pt: what", without the path twice
      std::string what = e.what();
      const std::string path = (fs::path(dir) / name).string() + ": ";
      if (what.rfind(path, 0) == 0) what = what.substr(path.size());
      if (what.rfind("damaged: ", 0) == 0) what = what.substr(9);
      TANDEM_FAIL(name, ": ", what);
    }
    torch::serialize::InputArchive archive;
    internal::load_checked_archive(bytes, archive);
    auto& file = files[name];
    json index;
    try {
      c10::IValue value;
      archive.read("checkpoint_id", value);
      TANDEM_CHECK(value.toStringRef() == id, name, " is a file of another checkpoint (", value.toStringRef(),
                   ", this one's: ", id, ")");
      for (const auto& [key, expected] : std::vector<std::pair<const char*, int64_t>>{{"rank", r}, {"ranks", ranks},
                                                                                      {"step", step}}) {
        archive.read(key, value);
        TANDEM_CHECK(value.toInt() == expected, name, " records ", key, " ", value.toInt(), ", the manifest ", expected);
      }
      archive.read("index", value);
      index = json::parse(value.toStringRef());
      for (const auto& meta : index) {
        const std::string key = meta.at("key").get<std::string>();
        TANDEM_CHECK(!file.index.count(key), name, ": piece ", key, " twice in its index");
        archive.read(key, file.data[key], /*is_buffer=*/true);
        file.index[key] = meta;
      }
      if (r == 0) {
        for (const auto& key : archive.keys()) {
          if (key.rfind("h_", 0) == 0) archive.read(key, out.header[key.substr(2)]);
        }
        archive.read("cpu_rng", out.cpu_rng, /*is_buffer=*/true);
        TANDEM_CHECK(out.header.count("step") && out.header.at("step").toInt() == step, name,
                     " holds another step than the manifest's ", step);
      }
    } catch (const tandem::Error&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      TANDEM_FAIL(name, ": not a rank's file of a ", kFormat, " (", what.substr(0, what.find('\n')), ")");
    }
  }
  for (const auto& t : field(manifest, "tensors", json::value_t::array, where)) {
    const std::string name = field(t, "name", json::value_t::string, where).get<std::string>();
    const std::string about = where + ": " + name;
    const std::string dtype_name = field(t, "dtype", json::value_t::string, about).get<std::string>();
    const auto dtype = parse_dtype(dtype_name, about);
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
      TANDEM_CHECK(in != files.end() && in->second.index.count(key), about, ": a piece ", key, " of ", file,
                   ", which the files do not hold");
      TANDEM_CHECK(in->second.used.insert(key).second, about, ": piece ", key, " of ", file, " is listed twice");
      const auto& meta = in->second.index.at(key);
      const auto& piece = in->second.data.at(key);
      // The manifest's description of the tensor and the piece must be the file's own (sealed) one.
      TANDEM_CHECK(meta.value("name", "") == name && meta.value("dtype", "") == dtype_name &&
                       meta.value("shape", json()) == json(shape) && meta.value("strides", json()) == json(strides) &&
                       meta.value("offset", int64_t(-1)) == offset && piece.dim() == 1 && piece.numel() == numel &&
                       piece.scalar_type() == dtype && offset <= total && numel <= total - offset,
                   about, ": piece ", key, " of ", file, " is not what the manifest says (", meta.dump(), ")");
      spans.emplace_back(offset, numel);
      data.push_back(&piece);
    }
    check_cover(spans, total, about);  // before allocating what the manifest claims
    int64_t reach = total > 0 ? 1 : 0;
    bool overflow = false;
    for (size_t d = 0; d < shape.size() && total > 0 && !overflow; ++d) {
      int64_t span = 0;
      overflow = __builtin_mul_overflow(shape[d] - 1, strides[d], &span) || __builtin_add_overflow(reach, span, &reach);
    }
    TANDEM_CHECK(!overflow && reach <= total, about, ": strides ", c10::IntArrayRef(strides), " reach past its ", total,
                 " elements");
    auto flat = torch::empty({total}, torch::TensorOptions().dtype(dtype));
    for (size_t i = 0; i < spans.size(); ++i) flat.narrow(0, spans[i].first, spans[i].second).copy_(*data[i]);
    auto whole = flat.as_strided(shape, strides);
    TANDEM_CHECK(total == 0 || whole.is_non_overlapping_and_dense(), about, ": strides ", c10::IntArrayRef(strides),
                 " are not a dense order of its elements");
    out.tensors.emplace_back(name, whole.contiguous());
  }
  // Every piece a file holds is in the manifest: none left out (a tensor, or momentum, silently missing).
  for (const auto& [name, file] : files) {
    for (const auto& [key, meta] : file.index) {
      TANDEM_CHECK(file.used.count(key), where, ": leaves out piece ", key, " of ", name, " (",
                   meta.value("name", ""), ")");
    }
  }
  return out;
}

}  // namespace

AssembledCheckpoint read(const std::string& dir) {
  try {
    return read_checked(dir);
  } catch (const tandem::Error& e) {  // no whole checkpoint: --resume tries the one before
    throw DamagedCheckpoint(std::string("damaged: ") + e.what());
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw DamagedCheckpoint("damaged: not a readable " + std::string(kFormat) + " (" +
                            what.substr(0, what.find('\n')) + ")");
  }
}

}  // namespace tandem::checkpoint::sharded
