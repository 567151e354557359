#include <gtest/gtest.h>

#include "tandem/util/check.h"
#include "tandem/util/parse.h"

namespace tandem {

TEST(ParseTest, IntegersAreParsedWholeOrNotAtAll) {
  EXPECT_EQ(parse_int("42"), 42);
  EXPECT_EQ(parse_int("-7"), -7);
  EXPECT_FALSE(parse_int(""));
  EXPECT_FALSE(parse_int("4x"));
  EXPECT_FALSE(parse_int("1e3"));
  EXPECT_FALSE(parse_int("99999999999999999999"));
  for (const char* loose : {" 42", "+42", "0x10", "42 ", "\t1"}) EXPECT_FALSE(parse_int(loose)) << loose;
}

TEST(ParseTest, UnsignedIntegersTakeTheWholeRange) {
  EXPECT_EQ(parse_uint("18446744073709551615"), 18446744073709551615ull);
  EXPECT_EQ(parse_uint("0"), 0ull);
  for (const char* bad : {"-1", "", "18446744073709551616", "+1", "0x10", " 1"}) EXPECT_FALSE(parse_uint(bad)) << bad;
}

TEST(ParseTest, DoublesRejectGarbageAndNonFinite) {
  EXPECT_DOUBLE_EQ(*parse_double("0.1"), 0.1);
  EXPECT_DOUBLE_EQ(*parse_double("1e-3"), 1e-3);
  EXPECT_FALSE(parse_double("abc"));
  EXPECT_FALSE(parse_double("0.1.2"));
  EXPECT_FALSE(parse_double("nan"));
  EXPECT_FALSE(parse_double("inf"));
  EXPECT_DOUBLE_EQ(*parse_double("-2"), -2);
  for (const char* loose : {" 0.1", "+0.1", "0x10", "0x1p3", "0.1 "}) EXPECT_FALSE(parse_double(loose)) << loose;
}

TEST(ParseTest, SplitKeepsEmptyParts) {
  EXPECT_EQ(split("a,b,,c", ','), (std::vector<std::string>{"a", "b", "", "c"}));
  EXPECT_EQ(split("", ','), (std::vector<std::string>{""}));
}

TEST(CheckTest, MessageIsTheConcatenatedParts) {
  try {
    TANDEM_CHECK(1 + 1 == 3, "file ", "x.bin", ": expected ", 4, " bytes");
    FAIL() << "no throw";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "file x.bin: expected 4 bytes");
  }
  EXPECT_NO_THROW(TANDEM_CHECK(true, "never"));
}

}  // namespace tandem
