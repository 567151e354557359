// tandem/util/atomic_file.h: replace a file all at once or not at all, and
// refuse before a run starts the outputs it could not write.
//
// The content goes to "<path>.tmp-<pid>", is flushed to disk (fsync), renamed
// over <path>, and the directory is synced. A crash or a full disk leaves the
// previous <path> untouched; the error names the path.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace tandem {

// The file rank `rank` writes for an output flag's `pattern`: rank 0 alone
// writes `pattern`, unless it holds "{rank}", when every rank writes its own
// with its number there. Empty for a rank that writes none, or no pattern.
std::string rank_output_path(const std::string& pattern, int64_t rank);

// Refuses, before any work is done, an output file (`flag` PATH) that could
// not be written later: PATH is a directory, or its folder is missing or
// not writable by this process. Throws tandem::Error naming the flag.
void check_output_file(const std::string& flag, const std::string& path);

// For a file that write_atomically writes: refuses a PATH that exists and is
// not a regular file (a device, FIFO or socket, or a link to one), which
// the rename would replace (`--export-weights /dev/null` as root would
// have replaced the system's /dev/null with weights). A link to a regular
// file, or none, is fine: write_atomically replaces the file it points to.
void check_replaceable_file(const std::string& flag, const std::string& path);

// `write_to(tmp_path)` writes the content to the given temporary path.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string& tmp_path)>& write_to);

// Refuses, before any work starts, an output folder (--tensorboard,
// --export-hf) that could not be written: a file is there, or the nearest
// existing folder above it is not writable by this process. Throws
// tandem::Error naming the flag.
void check_output_folder(const std::string& flag, const std::string& folder);

}  // namespace tandem
