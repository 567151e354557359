// tandem train --config FILE.toml: a job's flags in a TOML file, by the
// sections of --help (as torchtitan's TOML jobs), and the run's effective
// configuration written back in the same form.
//
// Note [job files]: a key is a flag's name (seq_len or seq-len) in the
// section --help lists it under ([data], [model], [optimisation],
// [distributed], [run]); its value a string, a number, a boolean (a switch:
// true gives it, false leaves it out) or an array (joined by commas, as
// --nproc-per-node 1,2,4 and --devices take lists). The file's flags come
// before the command line's, and a flag given on the command line
// replaces the file's. A key tandem does not know, a flag in another
// section, a table inside a section or --config inside the file is
// refused, naming the file and the key. Numbers are written with 17
// significant digits, so a double is the same double.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "tandem/cli/flags.h"

namespace tandem::cli {

// `args` with --config FILE replaced by the file's flags (those the
// command line does not give), first. Throws UsageError naming the file
// and key. `flags` is the command's table (names, sections, switches).
// `origins` (when given) gets each file flag's "--config FILE: [section] key".
std::vector<std::string> with_config_file(const std::vector<std::string>& args, const FlagSet& flags,
                                          std::map<std::string, std::string>* origins = nullptr);

// flags.parse(args), a value the job file gave refused naming its file and
// key too ("--config job.toml: [run] seed: --seed: expected ...").
void parse_with_origins(FlagSet& flags, const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& origins);

// The flags of `args` (a command line without --config, as
// with_config_file returns it) as a job file --config reads: each flag
// under its section, values as strings, switches as true. The run writes
// it once it has started (engine/run_record.h).
std::string config_text(const std::vector<std::string>& args, const FlagSet& flags);

}  // namespace tandem::cli
