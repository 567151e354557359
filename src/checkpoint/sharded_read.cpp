// Reading a sharded checkpoint (sharded_checkpoint.h): the manifest checked
// first, then every rank's sealed file in turn against it, each piece
// handed on as its file is read: into whole tensors (read), or into the
// parts a rank holds (read_into, Note [loading by overlap]).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/sharded_checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"
#include "checkpoint_archive.h"
#include "sharded_internal.h"

namespace tandem::checkpoint::sharded {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using internal::kFormat;
using internal::kVersion;

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

struct ManifestPiece {
  std::string file, key;
  int64_t offset = 0, numel = 0;
};
struct ManifestTensor {
  std::string name, dtype_name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape, strides;
  int64_t total = 0;
  std::vector<ManifestPiece> pieces;
};
struct Manifest {
  std::string id;
  int64_t ranks = 0, step = 0;
  std::vector<int64_t> bytes;  // each rank file's size
  std::vector<ManifestTensor> tensors;
};

// An exception a caller's check threw, carried through the walk unchanged.
struct Passed {
  std::exception_ptr error;
};

// The manifest, every claim it makes about the shapes and the cover of
// each tensor checked before any file is read.
Manifest parse_manifest(const std::string& dir) {
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
  Manifest out;
  out.id = field(manifest, "id", json::value_t::string, where).get<std::string>();
  out.ranks = integer(manifest, "ranks", where);
  out.step = integer(manifest, "step", where);
  const auto& listed = field(manifest, "files", json::value_t::array, where);
  TANDEM_CHECK(out.ranks >= 1 && static_cast<int64_t>(listed.size()) == out.ranks, where, ": its \"files\" list ",
               listed.size(), " file(s) but its \"ranks\" is ", out.ranks,
               " (the writing job's, one file per rank expected)");
  for (int64_t r = 0; r < out.ranks; ++r) {
    TANDEM_CHECK(field(listed[static_cast<size_t>(r)], "file", json::value_t::string, where) == rank_file(r), where,
                 ": file ", r, " is ", listed[static_cast<size_t>(r)].at("file").dump(), ", expected ", rank_file(r));
    out.bytes.push_back(integer(listed[static_cast<size_t>(r)], "bytes", where));
  }
  std::set<std::pair<std::string, std::string>> listed_pieces;
  for (const auto& t : field(manifest, "tensors", json::value_t::array, where)) {
    ManifestTensor tensor;
    tensor.name = field(t, "name", json::value_t::string, where).get<std::string>();
    const std::string about = where + ": " + tensor.name;
    tensor.dtype_name = field(t, "dtype", json::value_t::string, about).get<std::string>();
    tensor.dtype = parse_dtype(tensor.dtype_name, about);
    tensor.shape = integers(t, "shape", about);
    tensor.strides = integers(t, "strides", about);
    TANDEM_CHECK(tensor.shape.size() == tensor.strides.size(), about, ": ", tensor.shape.size(), " sizes but ",
                 tensor.strides.size(), " strides");
    tensor.total = internal::elements(tensor.shape, about);
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (const auto& p : field(t, "pieces", json::value_t::array, about)) {
      ManifestPiece piece{field(p, "file", json::value_t::string, about).get<std::string>(),
                          field(p, "key", json::value_t::string, about).get<std::string>(), integer(p, "offset", about),
                          integer(p, "numel", about)};
      const int64_t r = piece.file.rfind("rank-", 0) == 0 ? std::atoll(piece.file.c_str() + 5) : -1;
      TANDEM_CHECK(r >= 0 && r < out.ranks && piece.file == rank_file(r), about, ": a piece ", piece.key, " of ",
                   piece.file, ", which the files do not hold");
      TANDEM_CHECK(listed_pieces.emplace(piece.file, piece.key).second, about, ": piece ", piece.key, " of ",
                   piece.file, " is listed twice");
      spans.emplace_back(piece.offset, piece.numel);
      tensor.pieces.push_back(std::move(piece));
    }
    internal::check_cover(spans, tensor.total, about);  // before anything is allocated for it
    int64_t reach = tensor.total > 0 ? 1 : 0;
    bool overflow = false;
    for (size_t d = 0; d < tensor.shape.size() && tensor.total > 0 && !overflow; ++d) {
      int64_t span = 0;
      overflow = __builtin_mul_overflow(tensor.shape[d] - 1, tensor.strides[d], &span) ||
                 __builtin_add_overflow(reach, span, &reach);
    }
    TANDEM_CHECK(!overflow && reach <= tensor.total, about, ": strides ", c10::IntArrayRef(tensor.strides),
                 " reach past its ", tensor.total, " elements");
    TANDEM_CHECK(tensor.total == 0 || torch::empty_strided(tensor.shape, tensor.strides, torch::kMeta)
                                          .is_non_overlapping_and_dense(),
                 about, ": strides ", c10::IntArrayRef(tensor.strides), " are not a dense order of its elements");
    out.tensors.push_back(std::move(tensor));
  }
  return out;
}

// Every rank's file in turn, checked to be this checkpoint's and to hold
// exactly the pieces the manifest gives it: rank 0's header to `on_header`
// first, then each piece to `visit` (its tensor, its offset, its data), the
// file's data dropped before the next is read.
using Visit = std::function<void(const ManifestTensor&, const ManifestPiece&, const torch::Tensor&)>;
void walk(const std::string& dir, const Manifest& manifest, const HeaderCheck& on_header, const Visit& visit) {
  std::map<std::string, std::vector<std::pair<const ManifestTensor*, const ManifestPiece*>>> by_file;
  for (const auto& t : manifest.tensors) {
    for (const auto& p : t.pieces) by_file[p.file].emplace_back(&t, &p);
  }
  for (int64_t r = 0; r < manifest.ranks; ++r) {
    const std::string name = rank_file(r);
    std::string bytes;
    try {
      std::error_code ec;
      const auto size = fs::file_size(fs::path(dir) / name, ec);
      TANDEM_CHECK(ec || static_cast<int64_t>(size) == manifest.bytes[static_cast<size_t>(r)], "its ", size,
                   " bytes are not the manifest's ", manifest.bytes[static_cast<size_t>(r)]);
      bytes = checkpoint::internal::verified_archive((fs::path(dir) / name).string());
    } catch (const tandem::Error& e) {  // "rank-1.pt: what", without the path twice
      std::string what = e.what();
      const std::string path = (fs::path(dir) / name).string() + ": ";
      if (what.rfind(path, 0) == 0) what = what.substr(path.size());
      if (what.rfind("damaged: ", 0) == 0) what = what.substr(9);
      TANDEM_FAIL(name, ": ", what);
    }
    torch::serialize::InputArchive archive;
    checkpoint::internal::load_checked_archive(bytes, archive);
    bytes.clear();
    std::map<std::string, json> index;  // by key
    try {
      c10::IValue value;
      archive.read("checkpoint_id", value);
      TANDEM_CHECK(value.toStringRef() == manifest.id, name, " is a file of another checkpoint (", value.toStringRef(),
                   ", this one's: ", manifest.id, ")");
      for (const auto& [key, expected] :
           std::vector<std::pair<const char*, int64_t>>{{"rank", r}, {"ranks", manifest.ranks}, {"step", manifest.step}}) {
        archive.read(key, value);
        TANDEM_CHECK(value.toInt() == expected, name, " records ", key, " ", value.toInt(), ", the manifest ", expected);
      }
      archive.read("index", value);
      for (const auto& meta : json::parse(value.toStringRef())) {
        const std::string key = meta.at("key").get<std::string>();
        TANDEM_CHECK(index.emplace(key, meta).second, name, ": piece ", key, " twice in its index");
      }
      if (r == 0) {
        std::map<std::string, c10::IValue> header;
        for (const auto& key : archive.keys()) {
          if (key.rfind("h_", 0) == 0) archive.read(key, header[key.substr(2)]);
        }
        torch::Tensor cpu_rng;
        archive.read("cpu_rng", cpu_rng, /*is_buffer=*/true);
        TANDEM_CHECK(header.count("step") && header.at("step").toInt() == manifest.step, name,
                     " holds another step than the manifest's ", manifest.step);
        try {
          if (on_header) on_header(header, cpu_rng);
        } catch (...) {
          throw Passed{std::current_exception()};
        }
      }
    } catch (const tandem::Error&) {
      throw;
    } catch (const Passed&) {
      throw;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      TANDEM_FAIL(name, ": not a rank's file of a ", kFormat, " (", what.substr(0, what.find('\n')), ")");
    }
    std::set<std::string> used;
    for (const auto& [t, p] : by_file[name]) {
      const std::string about = std::string(kManifest) + ": " + t->name;
      auto meta = index.find(p->key);
      TANDEM_CHECK(meta != index.end(), about, ": a piece ", p->key, " of ", name, ", which the files do not hold");
      used.insert(p->key);
      torch::Tensor data;
      try {
        archive.read(p->key, data, /*is_buffer=*/true);
      } catch (const std::exception& e) {
        const std::string what = e.what();
        TANDEM_FAIL(name, ": not a rank's file of a ", kFormat, " (", what.substr(0, what.find('\n')), ")");
      }
      // The manifest's description of the tensor and the piece must be the file's own (sealed) one.
      const auto& m = meta->second;
      TANDEM_CHECK(m.value("name", "") == t->name && m.value("dtype", "") == t->dtype_name &&
                       m.value("shape", json()) == json(t->shape) && m.value("strides", json()) == json(t->strides) &&
                       m.value("offset", int64_t(-1)) == p->offset && data.dim() == 1 && data.numel() == p->numel &&
                       data.scalar_type() == t->dtype,
                   about, ": piece ", p->key, " of ", name, " is not what the manifest says (", m.dump(), ")");
      try {
        visit(*t, *p, data);
      } catch (...) {
        throw Passed{std::current_exception()};
      }
    }
    // Every piece a file holds is in the manifest: none left out (a tensor, or momentum, silently missing).
    for (const auto& [key, meta] : index) {
      TANDEM_CHECK(used.count(key), kManifest, ": leaves out piece ", key, " of ", name, " (", meta.value("name", ""),
                   ")");
    }
  }
}

// `run` with what is not one whole checkpoint thrown as DamagedCheckpoint;
// what a caller's check threw, as it was.
template <class Run>
auto damaged_unless_whole(Run run) -> decltype(run()) {
  try {
    return run();
  } catch (const Passed& passed) {
    std::rethrow_exception(passed.error);
  } catch (const tandem::Error& e) {  // no whole checkpoint: --resume tries the one before
    throw DamagedCheckpoint(std::string("damaged: ") + e.what());
  } catch (const std::exception& e) {
    const std::string what = e.what();
    throw DamagedCheckpoint("damaged: not a readable " + std::string(kFormat) + " (" +
                            what.substr(0, what.find('\n')) + ")");
  }
}

// The pieces a reader wants of one tensor, checked against it.
std::vector<StatePiece*> checked(std::vector<StatePiece*> wanted, const ManifestTensor& t) {
  for (const auto* w : wanted) {
    const int64_t numel = w->data.numel();
    TANDEM_CHECK(w->data.dim() == 1 && w->offset >= 0 && w->offset + numel <= t.total &&
                     w->strides.size() == w->shape.size() &&
                     (t.total == 0 || torch::empty_strided(w->shape, w->strides, torch::kMeta).is_non_overlapping_and_dense()),
                 "loading ", w->name, ": a wanted piece of ", numel, " elements at ", w->offset, " of its ", t.total,
                 " in the order of strides ", c10::IntArrayRef(w->strides));
  }
  return wanted;
}

// Note [loading by overlap]: the written piece `p` (a run of `t`'s
// elements in the writer's order) copied into each wanted piece where they
// overlap. In the same order, an overlap is one run of both. In another,
// each written element's index in the wanted order is computed (from its
// coordinates: in a dense order a dimension's stride is the product of the
// sizes inside it), a transient index as long as the written piece, and
// the elements that fall in a wanted run are copied to their places.
void copy_overlap(const std::vector<StatePiece*>& wanted, const ManifestTensor& t, const ManifestPiece& p,
                  const torch::Tensor& data) {
  torch::Tensor places;  // in the wanted order, for the wanted pieces of one other order
  std::vector<int64_t> places_for;
  for (auto* w : wanted) {
    const int64_t numel = w->data.numel();
    if (numel == 0 || p.numel == 0) continue;
    if (w->strides == t.strides) {
      const int64_t begin = std::max(w->offset, p.offset), end = std::min(w->offset + numel, p.offset + p.numel);
      if (begin < end) {
        w->data.narrow(0, begin - w->offset, end - begin).copy_(data.narrow(0, begin - p.offset, end - begin));
      }
      continue;
    }
    if (!places.defined() || places_for != w->strides) {
      const auto index = torch::arange(p.offset, p.offset + p.numel, torch::kInt64);
      places = torch::zeros({p.numel}, torch::kInt64);
      for (size_t d = 0; d < t.shape.size(); ++d) {
        places.add_(index.div(t.strides[d], "floor").remainder(t.shape[d]).mul_(w->strides[d]));
      }
      places_for = w->strides;
    }
    const auto inside = places.ge(w->offset).logical_and_(places.lt(w->offset + numel)).nonzero().view({-1});
    if (inside.numel() == 0) continue;
    w->data.index_copy_(0, places.index_select(0, inside).sub_(w->offset),
                        data.index_select(0, inside).to(w->data.scalar_type()));
  }
}

}  // namespace

AssembledCheckpoint read(const std::string& dir) {
  return damaged_unless_whole([&] {
    const Manifest manifest = parse_manifest(dir);
    AssembledCheckpoint out;
    std::unordered_map<const ManifestTensor*, torch::Tensor> flat;
    for (const auto& t : manifest.tensors) flat[&t] = torch::empty({t.total}, torch::TensorOptions().dtype(t.dtype));
    walk(
        dir, manifest,
        [&](const std::map<std::string, c10::IValue>& header, const torch::Tensor& cpu_rng) {
          out.header = header;
          out.cpu_rng = cpu_rng;
        },
        [&](const ManifestTensor& t, const ManifestPiece& p, const torch::Tensor& data) {
          flat.at(&t).narrow(0, p.offset, p.numel).copy_(data);
        });
    for (const auto& t : manifest.tensors) {
      out.tensors.emplace_back(t.name, flat.at(&t).as_strided(t.shape, t.strides).contiguous());
      flat.erase(&t);
    }
    return out;
  });
}

std::set<std::string> read_into(const std::string& dir, std::vector<StatePiece>& wanted, const HeaderCheck& on_header,
                                const PieceCheck& inspect) {
  return damaged_unless_whole([&] {
    const Manifest manifest = parse_manifest(dir);
    std::map<std::string, const ManifestTensor*> by_name;
    for (const auto& t : manifest.tensors) by_name[t.name] = &t;
    std::set<std::string> absent;
    std::unordered_map<const ManifestTensor*, std::vector<StatePiece*>> targets;
    for (auto& w : wanted) {
      auto found = by_name.find(w.name);
      if (found == by_name.end()) {
        absent.insert(w.name);
        continue;
      }
      targets[found->second].push_back(&w);
    }
    // A tensor's shape is compared with the run's once a file has shown the
    // manifest's description of it to be its own (walk checks each piece
    // first): an edited manifest is damage, a checkpoint of another shape a
    // mismatch to name.
    std::set<const ManifestTensor*> compared;
    walk(dir, manifest, on_header, [&](const ManifestTensor& t, const ManifestPiece& p, const torch::Tensor& data) {
      if (inspect) inspect(t.name, data);
      auto found = targets.find(&t);
      if (found == targets.end()) return;
      if (compared.insert(&t).second) {
        for (const auto* w : found->second) {
          TANDEM_CHECK(w->shape == t.shape, w->name, " is of shape ", c10::IntArrayRef(t.shape),
                       " in the checkpoint, ", c10::IntArrayRef(w->shape), " in this run");
        }
        found->second = checked(found->second, t);
      }
      copy_overlap(found->second, t, p, data);
    });
    return absent;
  });
}

}  // namespace tandem::checkpoint::sharded
