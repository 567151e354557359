#include "tandem/cli/commands.h"

int main(int argc, char** argv) { return tandem::cli::main_command(argc, argv); }
