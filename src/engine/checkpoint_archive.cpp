// Checkpoint files as bytes: the trailer that seals them, and the checks
// that stand between such a file and libtorch's reader
// (checkpoint_archive.h).
#include "checkpoint_archive.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include "tandem/engine/checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::engine {
namespace internal {
namespace {

// Note [checkpoint trailer]: after the libtorch archive (a zip file) come
// kTrailerSize bytes: the magic "TANDEMCK", the archive's length (8 bytes,
// little-endian) and its CRC-32 (4 bytes, little-endian, zlib's). A file cut
// short or altered anywhere fails the check before anything is loaded.
constexpr char kMagic[8] = {'T', 'A', 'N', 'D', 'E', 'M', 'C', 'K'};
constexpr size_t kTrailerSize = 8 + 8 + 4;

uint32_t crc_of(const std::string& bytes) {
  uLong crc = crc32(0L, Z_NULL, 0);
  size_t done = 0;
  while (done < bytes.size()) {  // zlib takes uInt lengths
    auto n = static_cast<uInt>(std::min<size_t>(bytes.size() - done, 1u << 30));
    crc = crc32(crc, reinterpret_cast<const Bytef*>(bytes.data() + done), n);
    done += n;
  }
  return static_cast<uint32_t>(crc);
}

void put_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
uint64_t get_le(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t(static_cast<unsigned char>(in[i])) << (8 * i);
  return value;
}


// Note [pickle bounds]: libtorch's unpickler believes the lengths and memo
// indices a pickle declares: a 13 kB archive whose data.pkl stores into memo
// slot 1.6 billion made it grow its memo table to 25.6 GB, and one that
// declares a 4 GB string made it reserve 4 GB, before anything failed
// (fuzz_checkpoint; docs/RELIABILITY.md). So before libtorch reads an
// archive, its records' declared sizes are checked against the archive's,
// and every *.pkl and *.debug_pkl record is walked opcode by opcode (the pickle protocol's
// fixed argument layout, nothing is built): a string or frame longer than
// what is left of the record, or a memo index not below the record's length
// (a pickler numbers its memo entries 0, 1, 2, ..., one per PUT of at least
// two bytes), is refused. Such an archive is not one tandem wrote. The
// *.debug_pkl records were missed at first: an archive whose TorchScript
// code no longer parsed made libtorch unpickle one to point at the error,
// and it declared a 3.4e18-byte string (fuzz_checkpoint, 2026-11-25;
// fuzz/regressions/checkpoint/debug-pkl-string-3e18).
class StringReader : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit StringReader(const std::string& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string& bytes_;
};

void check_pickle(const uint8_t* data, size_t size, const std::string& name) {
  size_t at = 0;
  auto need = [&](uint64_t n, const char* what) {
    TANDEM_CHECK(n <= size - at, name, ": ", what, " of ", n, " bytes at offset ", at,
                 " runs past the end of the record (", size, " bytes)");
  };
  auto fixed = [&](size_t n) -> uint64_t {  // a little-endian argument of n bytes
    need(n, "an argument");
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(data[at + i]) << (8 * i);
    at += n;
    return v;
  };
  auto line = [&] {  // a newline-terminated argument
    const void* end = std::memchr(data + at, '\n', size - at);
    TANDEM_CHECK(end != nullptr, name, ": an unterminated text argument at offset ", at);
    at = static_cast<const uint8_t*>(end) - data + 1;
  };
  auto memo = [&](uint64_t index) {
    TANDEM_CHECK(index < size, name, ": memo index ", index, " at offset ", at,
                 " is beyond any this record could hold (", size, " bytes)");
  };
  while (at < size) {
    uint8_t op = data[at++];
    switch (op) {
      case '.':  // STOP
        return;
      case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p':
        line();
        break;
      case 'c': case 'i':  // GLOBAL, INST: module and name
        line();
        line();
        break;
      case 'K': case 'h': case 0x80: case 0x82:  // BININT1, BINGET, PROTO, EXT1
        fixed(1);
        break;
      case 'q':  // BINPUT
        memo(fixed(1));
        break;
      case 'M': case 0x83:  // BININT2, EXT2
        fixed(2);
        break;
      case 'J': case 'j': case 0x84:  // BININT, LONG_BINGET, EXT4
        fixed(4);
        break;
      case 'r':  // LONG_BINPUT
        memo(fixed(4));
        break;
      case 'G':  // BINFLOAT
        fixed(8);
        break;
      case 'U': case 'C': case 0x8a: case 0x8c: {  // 1-byte length, then the data
        uint64_t n = fixed(1);
        need(n, "a string");
        at += n;
        break;
      }
      case 'T': case 'X': case 'B': case 0x8b: {  // 4-byte length
        uint64_t n = fixed(4);
        need(n, "a string");
        at += n;
        break;
      }
      case 0x8d: case 0x8e: case 0x96: case 0x95: {  // 8-byte length (0x95: FRAME)
        uint64_t n = fixed(8);
        need(n, op == 0x95 ? "a frame" : "a string");
        if (op != 0x95) at += n;  // a frame's contents are opcodes
        break;
      }
      default:  // no argument, or an opcode libtorch refuses itself
        break;
    }
  }
}

void check_archive_bounds(const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<StringReader>(bytes));
  for (const auto& name : reader.getAllRecords()) {
    size_t declared = reader.getRecordSize(name);
    TANDEM_CHECK(declared <= bytes.size(), name, ": declares ", declared,
                 " bytes, more than the whole archive (", bytes.size(), ")");
    // data.pkl and the like, and the code's *.debug_pkl (source ranges, which
    // libtorch unpickles when the archive's TorchScript code fails to parse).
    auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (!ends_with(".pkl") && !ends_with(".debug_pkl")) continue;
    auto [record, size] = reader.getRecord(name);
    check_pickle(static_cast<const uint8_t*>(record.get()), size, name);
  }
}

// Note [storage records]: libtorch's unpickler makes each storage from its
// record (data/N), with the number of bytes data.pkl declares for it, and
// never compares the two; a tensor's sizes and strides are then set from
// data.pkl without comparing them with its storage either. A record cut
// short (with a matching CRC: a tampered file) was read past its end: NaN
// weights, or a crash; libtorch's Optimizer::load reads some itself. So
// once the archive is parsed, before anything reads a tensor's data, every
// tensor in it is checked: it must lie within its storage, and the
// storages' declared sizes must fit the archive's records (each of an honest
// file holds exactly one storage of its size; matched here largest first,
// each to the smallest record left that holds it).

void check_within_storage(const ReadTensor& read) {
  const auto& t = read.tensor;
  if (!t.defined() || t.numel() == 0) return;
  int64_t last = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    TANDEM_CHECK(t.stride(d) >= 0, read.name, ": a negative stride");
    last += (t.size(d) - 1) * t.stride(d);
  }
  const auto needed = static_cast<uint64_t>(last + 1) * t.element_size();
  TANDEM_CHECK(t.storage_offset() >= 0 && needed <= t.storage().nbytes(), read.name,
               ": its storage holds ", t.storage().nbytes(), " bytes, the tensor (", t.sizes(), ", ",
               t.scalar_type(), ") needs ", needed);
}

void check_storage_records(const std::vector<ReadTensor>& tensors, const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<StringReader>(bytes));
  std::multiset<uint64_t> records;
  for (const auto& name : reader.getAllRecords()) {
    if (name.rfind("data/", 0) == 0) records.insert(reader.getRecordSize(name));
  }
  std::set<const void*> seen;  // each storage once, in the order read
  std::vector<std::pair<uint64_t, const ReadTensor*>> declared;
  for (const auto& read : tensors) {
    if (!read.tensor.defined()) continue;
    check_within_storage(read);
    if (seen.insert(read.tensor.storage().unsafeGetStorageImpl()).second) {
      declared.emplace_back(read.tensor.storage().nbytes(), &read);
    }
  }
  std::stable_sort(declared.begin(), declared.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [size, read] : declared) {
    auto record = records.lower_bound(size);
    TANDEM_CHECK(record != records.end(), read->name, ": data.pkl declares its storage as ", size,
                 " bytes, and no record of the archive left holds that many (",
                 records.empty() ? std::string("none left") : "the largest: " + std::to_string(*records.rbegin()),
                 "): a record was cut short");
    records.erase(record);
  }
}

// Every tensor in `value`, named by its path (attributes of objects, such
// as the archive's modules, by name; list and tuple items by index).

}  // namespace

// The archive inside a checkpoint file, once its trailer checks out.
std::string verified_archive(const std::string& path) {
  std::string bytes = read_regular_file(path, "a checkpoint file");  // Note [special files]
  TANDEM_CHECK(bytes.size() >= kTrailerSize &&
                   std::memcmp(bytes.data() + bytes.size() - kTrailerSize, kMagic, 8) == 0,
               "damaged: no tandem checksum trailer at its end (cut short, or not a tandem "
               "checkpoint of format ", kFormatVersion, ")");
  const char* trailer = bytes.data() + bytes.size() - kTrailerSize;
  uint64_t length = get_le(trailer + 8, 8);
  auto crc = static_cast<uint32_t>(get_le(trailer + 16, 4));
  TANDEM_CHECK(length == bytes.size() - kTrailerSize, "damaged: the trailer records ", length,
               " bytes of archive but the file holds ", bytes.size() - kTrailerSize);
  bytes.resize(length);
  TANDEM_CHECK(crc_of(bytes) == crc, "damaged: its CRC-32 does not match the one recorded when it "
                                     "was written (altered on disk)");
  return bytes;
}

void load_checked_archive(const std::string& bytes, torch::serialize::InputArchive& archive) {
  try {
    check_archive_bounds(bytes);  // Note [pickle bounds]
  } catch (const tandem::Error& e) {
    TANDEM_FAIL("not a readable tandem checkpoint (", e.what(), ")");
  }
  archive.load_from(bytes.data(), bytes.size(), torch::Device(torch::kCPU));  // Note [loading in place]
  std::vector<ReadTensor> tensors;  // Note [storage records]: before any data is read
  for (const auto& key : archive.keys()) {
    c10::IValue value;
    if (archive.try_read(key, value)) collect_tensors(value, key, tensors);
  }
  check_storage_records(tensors, bytes);
}

void collect_tensors(const c10::IValue& value, const std::string& name, std::vector<ReadTensor>& out) {
  auto child = [&](const std::string& part) { return name.empty() ? part : name + "." + part; };
  if (value.isTensor()) {
    out.push_back({name, value.toTensor()});
  } else if (value.isObject()) {
    const auto object = value.toObject();
    for (size_t i = 0; i < object->slots().size(); ++i) {
      collect_tensors(object->getSlot(i), child(object->type()->getAttributeName(i)), out);
    }
  } else if (value.isList()) {
    const auto list = value.toList();
    for (size_t i = 0; i < list.size(); ++i) collect_tensors(list.get(i), name + "[" + std::to_string(i) + "]", out);
  } else if (value.isTuple()) {
    const auto& items = value.toTupleRef().elements();
    for (size_t i = 0; i < items.size(); ++i) collect_tensors(items[i], name + "[" + std::to_string(i) + "]", out);
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      collect_tensors(entry.key(), name + "{key}", out);
      collect_tensors(entry.value(), name + "{value}", out);
    }
  }
}

}  // namespace internal

std::string seal_checkpoint(std::string archive) {
  const uint32_t crc = internal::crc_of(archive);
  const uint64_t length = archive.size();
  archive.append(internal::kMagic, 8);  // Note [checkpoint trailer]
  internal::put_le(archive, length, 8);
  internal::put_le(archive, crc, 4);
  return archive;
}

}  // namespace tandem::engine
