#include "tandem/observe/tensorboard.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "tandem/util/check.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::observe {
namespace {

namespace fs = std::filesystem;

// Protocol buffers' wire format: a key is the field number and the wire
// type (0 varint, 1 eight bytes, 2 length-delimited, 5 four bytes).
void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}

// Every Event starts with its wall time and step.
std::string event_head(double wall_time, int64_t step) {
  std::string out;
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(wall_time));
  std::memcpy(&bits, &wall_time, sizeof bits);
  put_key(out, 1, 1);
  put_little_endian(out, bits, 8);
  put_key(out, 2, 0);
  put_varint(out, static_cast<uint64_t>(step));  // int64: two's complement, as protobuf encodes it
  return out;
}

// The record format masks each CRC so that a CRC of data holding CRCs
// does not degenerate.
uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82f63b78u : c >> 1;  // reflected Castagnoli
      t[i] = c;
    }
    return t;
  }();
  return table;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
  const auto& table = crc_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::string event_record(const std::string& payload) {
  std::string length;
  put_little_endian(length, payload.size(), 8);
  std::string out = length;
  put_little_endian(out, masked(crc32c(length.data(), length.size())), 4);
  out += payload;
  put_little_endian(out, masked(crc32c(payload.data(), payload.size())), 4);
  return out;
}

std::string version_event(double wall_time) {
  std::string out = event_head(wall_time, 0);
  put_bytes(out, 3, "brain.Event:2");
  return out;
}

std::string scalars_event(double wall_time, int64_t step, const Scalars& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string v;
    put_bytes(v, 1, tag);
    const auto f = static_cast<float>(value);
    uint32_t bits = 0;
    std::memcpy(&bits, &f, sizeof bits);
    put_key(v, 2, 5);
    put_little_endian(v, bits, 4);
    put_bytes(summary, 1, v);
  }
  std::string out = event_head(wall_time, step);
  put_bytes(out, 5, summary);
  return out;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string log;
  put_key(log, 1, 0);
  put_varint(log, 1);  // SessionLog.status START
  std::string out = event_head(wall_time, step);
  put_bytes(out, 7, log);
  return out;
}

TensorBoardWriter::TensorBoardWriter(const std::string& folder, int64_t resumed_at) {
  check_output_folder("--tensorboard", folder);
  std::error_code ec;
  fs::create_directories(folder, ec);
  TANDEM_CHECK(!ec, "--tensorboard ", printable(folder), ": cannot make the folder: ", ec.message());
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const double now = now_seconds();
  path_ = (fs::path(folder) / format("events.out.tfevents.%lld.%s.%d.tandem", static_cast<long long>(now), host,
                                     static_cast<int>(::getpid())))
              .string();
  // Event files of an earlier run: a fresh run replaces them in TensorBoard's
  // view (a session start at step 0), rather than mixing two runs' steps.
  for (const auto& entry : fs::directory_iterator(folder, ec)) {
    if (entry.path().filename().string().find("tfevents") != std::string::npos) ++earlier_files_;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TANDEM_CHECK(fd_ >= 0, "--tensorboard: cannot create ", printable(path_), ": ", std::strerror(errno));
  try {
    append(version_event(now));
    if (resumed_at >= 0) {
      append(session_start_event(now, resumed_at + 1));  // keeps steps <= resumed_at
    } else if (earlier_files_ > 0) {
      append(session_start_event(now, 0));
    }
  } catch (...) {
    ::close(fd_);  // a file of nothing (a full disk) is not left behind
    fd_ = -1;
    ::unlink(path_.c_str());
    throw;
  }
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)), earlier_files_(other.earlier_files_) {}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    earlier_files_ = other.earlier_files_;
  }
  return *this;
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write(int64_t step, const Scalars& scalars) {
  if (fd_ >= 0 && !scalars.empty()) append(scalars_event(now_seconds(), step, scalars));
}

void TensorBoardWriter::append(const std::string& payload) {
  write_all(fd_, event_record(payload), "--tensorboard " + printable(path_));
}

}  // namespace tandem::observe
