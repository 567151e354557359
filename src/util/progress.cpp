#include "tandem/util/progress.h"

#include <unistd.h>

#include <cmath>
#include <sstream>

namespace tandem {

bool is_terminal(std::FILE* stream) { return ::isatty(::fileno(stream)) == 1; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  long long s = std::llround(seconds);
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld", s / 60, s % 60);
  }
  return buffer;
}

Progress::Progress(ProgressOptions options) : options_(std::move(options)) {}

std::string Progress::line(int64_t done, int64_t items, const std::string& status,
                           bool bar) const {
  double elapsed = frozen_ >= 0 ? frozen_ : clock_.seconds();
  double rate = elapsed > 0 ? items / elapsed : 0.0;
  double eta = done > 0 ? elapsed * (options_.total - done) / done : NAN;
  std::ostringstream out;
  out << options_.label << ' ';
  if (bar && options_.total > 0) {
    constexpr int kWidth = 24;
    int filled = static_cast<int>(kWidth * done / options_.total);
    out << '[' << std::string(filled, '#') << std::string(kWidth - filled, '.') << "] ";
  }
  char rate_text[32];
  std::snprintf(rate_text, sizeof rate_text, "%.0f", rate);
  out << done << '/' << options_.total << "  " << rate_text << ' ' << options_.unit << "/s";
  if (done < options_.total && frozen_ < 0) {
    out << "  eta " << format_duration(eta);
  } else {
    out << "  " << format_duration(elapsed);
  }
  if (!status.empty()) out << "  " << status;
  return out.str();
}

void Progress::update(int64_t done, int64_t items, const std::string& status) {
  double now = clock_.seconds();
  if (options_.live) {
    if (now - last_print_ < 0.1) return;  // at most 10 redraws a second
    std::fprintf(options_.out, "\r\033[K%s", line(done, items, status, true).c_str());
    std::fflush(options_.out);
    last_print_ = now;
  } else if (last_print_ < 0 ? now >= options_.line_interval
                             : now - last_print_ >= options_.line_interval) {
    std::fprintf(options_.out, "%s\n", line(done, items, status, false).c_str());
    std::fflush(options_.out);
    last_print_ = now;
  }
}

void Progress::freeze() { frozen_ = clock_.seconds(); }

void Progress::finish(int64_t done, int64_t items, const std::string& status) {
  std::string text = line(done, items, status, options_.live);
  if (options_.live) {
    std::fprintf(options_.out, "\r\033[K%s\n", text.c_str());
  } else {
    std::fprintf(options_.out, "%s\n", text.c_str());
  }
  std::fflush(options_.out);
}

}  // namespace tandem
