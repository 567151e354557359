// A worker for the launch tests: reports an error as a failing `tandem`
// does (launch::report_worker_error, to TANDEM_ERROR_FILE), then exits 1.
// usage: tandem_report_error own|peer MESSAGE [UNANSWERED]
// UNANSWERED: the ranks it found not answering, comma-separated.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/launch/worker_error.h"
#include "tandem/util/parse.h"

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4 || (std::strcmp(argv[1], "own") != 0 && std::strcmp(argv[1], "peer") != 0)) {
    std::fprintf(stderr, "usage: tandem_report_error own|peer MESSAGE [UNANSWERED]\n");
    return 2;
  }
  std::vector<int64_t> unanswered;
  if (argc == 4) {
    for (const auto& word : tandem::split(argv[3], ',')) unanswered.push_back(std::atoll(word.c_str()));
  }
  tandem::launch::report_worker_error(argv[2], std::strcmp(argv[1], "peer") == 0, unanswered);
  std::fprintf(stderr, "error: %s\n", argv[2]);
  return 1;
}
