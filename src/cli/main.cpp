#include "tandem/cli/commands.h"
#include "tandem/util/allocator.h"

int main(int argc, char** argv) {
  tandem::tune_malloc_for_training();  // Note [malloc for training]
  tandem::cli::quiet_library_logs();   // Note [library warnings]
  return tandem::cli::main_command(argc, argv);
}
