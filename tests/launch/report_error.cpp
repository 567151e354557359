// A worker for the launch tests: reports an error as a failing `tandem`
// does (launch::report_worker_error, to TANDEM_ERROR_FILE), then exits 1.
// usage: tandem_report_error own|peer MESSAGE
#include <cstdio>
#include <cstring>

#include "tandem/launch/worker_error.h"

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "own") != 0 && std::strcmp(argv[1], "peer") != 0)) {
    std::fprintf(stderr, "usage: tandem_report_error own|peer MESSAGE\n");
    return 2;
  }
  tandem::launch::report_worker_error(argv[2], std::strcmp(argv[1], "peer") == 0);
  std::fprintf(stderr, "error: %s\n", argv[2]);
  return 1;
}
