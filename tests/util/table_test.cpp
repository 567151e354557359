#include <gtest/gtest.h>

#include "tandem/util/check.h"
#include "tandem/util/progress.h"
#include "tandem/util/table.h"

namespace tandem {

TEST(TableTest, ColumnsArePaddedToTheWidestCell) {
  Table table({"epoch", "acc"});
  table.add_row({"1", "91.50%"});
  table.add_row({"10", "9%"});
  EXPECT_EQ(table.render(),
            "epoch | acc\n"
            "------+-------\n"
            "1     | 91.50%\n"
            "10    | 9%\n");
}

TEST(TableTest, RowWidthMustMatchHeader) {
  Table table({"a", "b"});
  EXPECT_THROW(table.add_row({"only one"}), Error);
}

TEST(FormatTest, PrintfStyle) {
  EXPECT_EQ(format("%.2f|%s|%05d", 3.14159, "x", 42), "3.14|x|00042");
  EXPECT_EQ(format_duration(65), "1:05");
  EXPECT_EQ(format_duration(3723), "1:02:03");
}

}  // namespace tandem
