#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

#include "tandem/cli/commands.h"
#include "tandem/util/allocator.h"
#include "tandem/util/cuda_module.h"

namespace {

// Note [terminate message]: std::terminate is reached where no tandem code
// can catch: an exception thrown through a library's noexcept function, or
// a library thread left joinable as an exception unwinds (c10d's Gloo
// group when the process runs out of address space or threads). It ends
// the process with a message naming what is known and exit code 1, as
// every other error, not a bare SIGABRT that the launcher reports as a
// crash.
[[noreturn]] void terminate_with_message() {
  std::string why = "a library ended the process (std::terminate) with no exception: often a thread that could "
                    "not be started, at the memory or thread limit (ulimit -v, ulimit -u)";
  if (auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::exception& e) {
      why = std::string("uncaught exception: ") + e.what();
    } catch (...) {
      why = "uncaught exception of an unknown type";
    }
  }
  const std::string line = "tandem: error: " + why + "\n";
  [[maybe_unused]] auto written = ::write(2, line.data(), line.size());
  std::_Exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  std::set_terminate(terminate_with_message);
  tandem::cuda::load_when_present();  // Note [CUDA as a module]
  tandem::tune_malloc_for_training();  // Note [malloc for training]
  tandem::cli::quiet_library_logs();   // Note [library warnings]
  return tandem::cli::main_command(argc, argv);
}
