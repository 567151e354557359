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
}

TEST(ParseTest, DoublesRejectGarbageAndNonFinite) {
  EXPECT_DOUBLE_EQ(*parse_double("0.1"), 0.1);
  EXPECT_DOUBLE_EQ(*parse_double("1e-3"), 1e-3);
  EXPECT_FALSE(parse_double("abc"));
  EXPECT_FALSE(parse_double("0.1.2"));
  EXPECT_FALSE(parse_double("nan"));
  EXPECT_FALSE(parse_double("inf"));
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
