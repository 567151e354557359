// The pickles of a checkpoint's archive, walked opcode by opcode before
// libtorch's unpickler reads them (checkpoint_archive.h): their bounds, and
// the storages they refer to.
#include <c10/core/ScalarType.h>

#include <cstring>
#include <map>
#include <optional>

#include "checkpoint_archive.h"
#include "tandem/util/check.h"

namespace tandem::checkpoint::internal {
namespace {

// What the walk knows of a value on the unpickler's stack: only what a
// storage reference is made of (strings, integers, storage types).
struct Value {
  enum Kind { kUnknown, kString, kInt, kStorageType } kind = kUnknown;
  std::string text;  // a string; a storage type's name ("FloatStorage")
  int64_t number = 0;
  uint64_t item_size = 0;  // a storage type's
};

// The byte size of torch.<name>, as libtorch's unpickler resolves the
// globals of storage types; 0 when it is none.
uint64_t storage_item_size(const std::string& name) {
#define TANDEM_STORAGE_SIZE(ctype, type) \
  if (name == #type "Storage") return sizeof(ctype);
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(TANDEM_STORAGE_SIZE)
#undef TANDEM_STORAGE_SIZE
  return 0;
}

}  // namespace

// Note [storage references]: a pickle refers to a storage by a persistent
// id, the tuple ('storage', torch.<Type>Storage, key, location, numel),
// and libtorch's unpickler makes the storage numel * sizeof(Type) bytes
// long around whatever record <archive>/<key> holds, without comparing the
// two. Tensors are then checked against their storages (Note [storage
// records]), so each reference is checked here against its record. The
// walk models the unpickler's stack only as far as these tuples: strings,
// integers and storage types pushed directly or fetched from the memo
// (whose slots only BINPUT and LONG_BINPUT set, to the stack's top). Each
// BINPERSID must take a tuple of five such values built by MARK ... TUPLE
// just before it, as torch's pickler writes them; any other is refused,
// for its storage could not be checked.
std::vector<StorageReference> check_pickle(const uint8_t* data, size_t size, const std::string& name) {
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
    std::string text(reinterpret_cast<const char*>(data + at), static_cast<const uint8_t*>(end) - (data + at));
    at += text.size() + 1;
    return text;
  };
  auto memo_index = [&](uint64_t index) {
    TANDEM_CHECK(index < size, name, ": memo index ", index, " at offset ", at,
                 " is beyond any this record could hold (", size, " bytes)");
    return index;
  };
  std::vector<StorageReference> references;
  std::map<uint64_t, Value> memo;
  Value top;                                // the stack's top, where known
  std::optional<std::vector<Value>> since;  // the values pushed since the last MARK, only
  std::optional<std::vector<Value>> tuple;  // the tuple TUPLE just built of them
  while (at < size) {
    const size_t op_at = at;
    const uint8_t op = data[at++];
    std::optional<Value> pushed;  // a value this opcode pushed, known or not
    bool keeps = false;           // an opcode that changes neither stack nor marks
    std::optional<std::vector<Value>> built;
    switch (op) {
      case '.':  // STOP
        return references;
      case '(':  // MARK
        since.emplace();
        tuple.reset();
        top = Value{};
        continue;
      case 't':  // TUPLE
        built = std::move(since);
        break;
      case 'Q': {  // BINPERSID
        TANDEM_CHECK(tuple && tuple->size() == 5 && (*tuple)[0].kind == Value::kString &&
                         (*tuple)[0].text == "storage" && (*tuple)[1].kind == Value::kStorageType &&
                         (*tuple)[2].kind == Value::kString && (*tuple)[3].kind == Value::kString &&
                         (*tuple)[4].kind == Value::kInt,
                     name, ": the storage reference at offset ", op_at,
                     " is not a tuple ('storage', torch.<type>Storage, key, location, size) as torch "
                     "writes one");
        const auto& t = *tuple;
        references.push_back({t[2].text, t[1].text, t[1].item_size, t[4].number, op_at});
        break;
      }
      case 'F': case 'I': case 'L': case 'P': case 'S': case 'V': case 'g': case 'p':
        line();
        break;
      case 'c': case 'i': {  // GLOBAL, INST: module and name
        std::string module = line();
        std::string global = line();
        pushed = Value{};
        if (op == 'c' && module == "torch" && storage_item_size(global) > 0) {
          *pushed = Value{Value::kStorageType, global, 0, storage_item_size(global)};
        }
        break;
      }
      case 'K':  // BININT1
        pushed = Value{Value::kInt, "", static_cast<int64_t>(fixed(1))};
        break;
      case 'M':  // BININT2
        pushed = Value{Value::kInt, "", static_cast<int64_t>(fixed(2))};
        break;
      case 'J':  // BININT
        pushed = Value{Value::kInt, "", static_cast<int64_t>(static_cast<int32_t>(fixed(4)))};
        break;
      case 'h': case 'j': {  // BINGET, LONG_BINGET
        auto found = memo.find(fixed(op == 'h' ? 1 : 4));
        pushed = found == memo.end() ? Value{} : found->second;
        break;
      }
      case 'q': case 'r':  // BINPUT, LONG_BINPUT: the memo slot takes the stack's top
        memo[memo_index(fixed(op == 'q' ? 1 : 4))] = top;
        keeps = true;
        break;
      case 0x80: case 0x82:  // PROTO, EXT1
        fixed(1);
        keeps = op == 0x80;
        break;
      case 0x83:  // EXT2
        fixed(2);
        break;
      case 0x84:  // EXT4
        fixed(4);
        break;
      case 'G':  // BINFLOAT
        fixed(8);
        pushed = Value{};
        break;
      case 0x8a: {  // LONG1: libtorch reads only 8-byte ones
        uint64_t n = fixed(1);
        need(n, "an integer");
        pushed = Value{};
        if (n == 8) pushed = Value{Value::kInt, "", static_cast<int64_t>(fixed(8))};
        else at += n;
        break;
      }
      case 'X': case 'U': case 'C': case 'T': case 'B': case 0x8b: case 0x8c: {  // a length, then the data
        uint64_t n = fixed(op == 'U' || op == 'C' || op == 0x8c ? 1 : 4);
        need(n, "a string");
        pushed = Value{};
        if (op == 'X') pushed = Value{Value::kString, std::string(reinterpret_cast<const char*>(data + at), n)};
        at += n;
        break;
      }
      case 0x8d: case 0x8e: case 0x96: case 0x95: {  // 8-byte length (0x95: FRAME)
        uint64_t n = fixed(8);
        need(n, op == 0x95 ? "a frame" : "a string");
        if (op != 0x95) at += n;  // a frame's contents are opcodes
        keeps = op == 0x95;
        break;
      }
      case 'N': case 0x88: case 0x89: case ')': case ']': case '}':  // NONE, booleans, empties
        pushed = Value{};
        break;
      default:  // no argument, or an opcode libtorch refuses itself
        break;
    }
    if (keeps) continue;
    tuple = std::move(built);
    if (pushed && since) since->push_back(*pushed);
    if (!pushed) since.reset();  // anything else may pop what was pushed since the MARK
    top = pushed ? *pushed : Value{};
  }
  return references;
}

}  // namespace tandem::checkpoint::internal
