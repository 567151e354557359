// Checkpoint files as bytes: the trailer that seals them, and the checks
// that stand between such a file and libtorch's reader
// (checkpoint_archive.h).
#include "checkpoint_archive.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/util/check.h"
#include "tandem/util/file.h"

namespace tandem::checkpoint {
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

void check_archive_bounds(const std::string& bytes) {
  caffe2::serialize::PyTorchStreamReader reader(std::make_shared<StringReader>(bytes));
  for (const auto& name : reader.getAllRecords()) {
    size_t declared = reader.getRecordSize(name);
    TANDEM_CHECK(declared <= bytes.size(), name, ": declares ", declared,
                 " bytes, more than the whole archive (", bytes.size(), ")");
  }
  for (const auto& name : reader.getAllRecords()) {
    // data.pkl and the like, and the code's *.debug_pkl (source ranges, which
    // libtorch unpickles when the archive's TorchScript code fails to parse).
    auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    const bool debug = ends_with(".debug_pkl");
    if (!ends_with(".pkl") && !debug) continue;
    auto [record, size] = reader.getRecord(name);
    auto references = check_pickle(static_cast<const uint8_t*>(record.get()), size, name);
    // Note [storage references]: data.pkl's storages are the records data/<key>.
    const std::string dir = name.substr(0, name.size() - 4) + "/";
    for (const auto& ref : references) {
      TANDEM_CHECK(!debug, name, ": a storage reference at offset ", ref.at, ", where none belongs");
      TANDEM_CHECK(ref.numel >= 0, name, ": storage ", ref.key, " declares ", ref.numel, " elements");
      if (ref.numel == 0) continue;  // libtorch reads no record for it
      const std::string record_name = dir + ref.key;
      TANDEM_CHECK(reader.hasRecord(record_name), name, ": storage ", ref.key, " has no record ",
                   record_name);
      const uint64_t held = reader.getRecordSize(record_name);
      TANDEM_CHECK(static_cast<uint64_t>(ref.numel) <= held / ref.item_size &&
                       static_cast<uint64_t>(ref.numel) * ref.item_size == held,
                   name, ": storage ", ref.key, " declares ", ref.numel, " elements of torch.", ref.type,
                   " (", ref.item_size, ref.item_size == 1 ? " byte" : " bytes", " each), but its record ", record_name, " holds ", held,
                   " bytes: a record cut short, or a reference altered");
    }
  }
}

// Note [storage records]: libtorch's unpickler sets a tensor's sizes,
// strides and offset from data.pkl without comparing them with its storage
// (whose length Note [storage references] has checked against its record).
// A tensor reaching past its storage was read past its end: NaN weights, or
// a crash; libtorch's Optimizer::load reads some itself. So once the
// archive is parsed, before anything reads a tensor's data, every tensor in
// it is checked to lie within its storage, in arithmetic that cannot
// overflow (sizes and strides are 64-bit integers of the file's choosing).
void check_within_storage(const ReadTensor& read) {
  const auto& t = read.tensor;
  if (!t.defined()) return;
  for (int64_t d = 0; d < t.dim(); ++d) {
    TANDEM_CHECK(t.size(d) >= 0 && t.stride(d) >= 0, read.name, ": a negative size or stride (",
                 t.sizes(), ", ", t.strides(), ")");
  }
  if (t.numel() == 0) return;
  int64_t last = t.storage_offset();
  bool overflow = last < 0;
  for (int64_t d = 0; d < t.dim() && !overflow; ++d) {
    int64_t reach = 0;
    overflow = __builtin_mul_overflow(t.size(d) - 1, t.stride(d), &reach) ||
               __builtin_add_overflow(last, reach, &last);
  }
  int64_t needed = 0;
  overflow = overflow || __builtin_add_overflow(last, 1, &needed) ||
             __builtin_mul_overflow(needed, static_cast<int64_t>(t.element_size()), &needed);
  TANDEM_CHECK(!overflow && static_cast<uint64_t>(needed) <= t.storage().nbytes(), read.name,
               ": its storage holds ", t.storage().nbytes(), " bytes, the tensor (", t.sizes(), ", ",
               t.strides(), ", offset ", t.storage_offset(), ", ", t.scalar_type(), ") reaches past it");
}

// Every tensor in `value`, named by its path (attributes of objects, such
// as the archive's modules, by name; list and tuple items by index).

}  // namespace

// Writes all of `bytes` to a new file at `path`; a short write (a full disk)
// is an error naming the path and the system's reason.
void write_file(const std::string& path, const std::string& bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd >= 0, path, ": cannot create: ", std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      TANDEM_FAIL(path, ": cannot write the checkpoint (", done, " of ", bytes.size(),
                  " bytes written): ", std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  TANDEM_CHECK(::close(fd) == 0, path, ": cannot write the checkpoint: ", std::strerror(errno));
}

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
  for (const auto& read : tensors) check_within_storage(read);
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

}  // namespace tandem::checkpoint
