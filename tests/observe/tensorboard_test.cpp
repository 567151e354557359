// The pieces of an event file: CRC-32C and the record frame. Their parse
// by TensorBoard itself is TensorBoardCliTest's.
#include <cstring>
#include <string>

#include <gtest/gtest.h>

#include "tandem/observe/tensorboard.h"

namespace tandem::observe {
namespace {

uint32_t read_u32(const std::string& bytes, size_t at) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[at + i]);
  return v;
}

TEST(TensorBoardTest, Crc32cHasItsCheckValueAndContinues) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32c(text.data(), text.size()), 0xe3069283u);  // the Castagnoli polynomial's check value
  EXPECT_EQ(crc32c(text.data() + 4, 5, crc32c(text.data(), 4)), 0xe3069283u);
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8a9136aau);  // RFC 3720's 32 zero bytes
}

TEST(TensorBoardTest, ARecordIsLengthChecksumPayloadChecksum) {
  const std::string payload = scalars_event(1.5, 7, {{"train/loss", 0.25}});
  const std::string record = event_record(payload);
  ASSERT_EQ(record.size(), 8 + 4 + payload.size() + 4);
  uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(record[i]);
  EXPECT_EQ(length, payload.size());
  EXPECT_EQ(record.substr(12, payload.size()), payload);
  auto masked = [](uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; };
  EXPECT_EQ(read_u32(record, 8), masked(crc32c(record.data(), 8)));
  EXPECT_EQ(read_u32(record, 12 + payload.size()), masked(crc32c(payload.data(), payload.size())));
  // The scalar is there as a float, after its tag.
  const float want = 0.25f;
  char bits[4];
  std::memcpy(bits, &want, 4);
  EXPECT_NE(payload.find("train/loss\x15" + std::string(bits, 4)), std::string::npos);
}

}  // namespace
}  // namespace tandem::observe
