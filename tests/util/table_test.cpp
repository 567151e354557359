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

namespace tandem {

TEST(ProgressTest, PlainLinesAndAFinalLineWithTheRealCount) {
  char* buffer = nullptr;
  size_t size = 0;
  std::FILE* out = open_memstream(&buffer, &size);
  {
    Progress progress({"epoch 1/2", /*total=*/100, "img", /*live=*/false,
                       /*line_interval=*/0.0, out});
    progress.update(10, 640, "loss 1.0000");
    progress.freeze();
    progress.finish(30, 1920, "stopped");
  }
  std::fclose(out);
  std::string text(buffer, size);
  std::free(buffer);
  EXPECT_NE(text.find("epoch 1/2 10/100  "), std::string::npos) << text;
  EXPECT_NE(text.find("loss 1.0000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("epoch 1/2 30/100  "), std::string::npos) << text;  // not 100/100
  EXPECT_EQ(text.find("\r"), std::string::npos) << "plain mode must not redraw";
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << text;
}

}  // namespace tandem
