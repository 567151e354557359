#include "tandem/util/table.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>

#include "tandem/util/check.h"

namespace tandem {

void Table::add_row(std::vector<std::string> cells) {
  TANDEM_CHECK(cells.size() == header_.size(), "table row has ", cells.size(),
               " cells, expected ", header_.size());
  rows_.push_back(std::move(cells));
}

std::string Table::render() const {
  std::vector<size_t> width(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) width[c] = std::max(width[c], row[c].size());
  }
  auto render_row = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c > 0) text += " | ";
      text += cells[c] + std::string(width[c] - cells[c].size(), ' ');
    }
    while (!text.empty() && text.back() == ' ') text.pop_back();
    return text + "\n";
  };
  std::string out = render_row(header_);
  for (size_t c = 0; c < width.size(); ++c) {
    if (c > 0) out += "-+-";
    out += std::string(width[c], '-');
  }
  out += "\n";
  for (const auto& row : rows_) out += render_row(row);
  return out;
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? n : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), n + 1, fmt, args);
  va_end(args);
  return out;
}

std::string gib(double bytes) { return format("%.2f", bytes / (1024.0 * 1024.0 * 1024.0)); }

}  // namespace tandem
