// tandem/util/table.h: a plain-text table for summaries.
#pragma once

#include <string>
#include <vector>

namespace tandem {

class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  // A row must have as many cells as the header (throws tandem::Error).
  void add_row(std::vector<std::string> cells);
  // Columns padded to their widest cell, a rule under the header.
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// printf-style formatting into a std::string, e.g. format("%.2f", x).
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Bytes in GiB with two decimals: "1.50" (the unit is the caller's to say).
std::string gib(double bytes);

}  // namespace tandem
