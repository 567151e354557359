// tandem/util/file.h: what a path names, names made printable, and reading
// files that must be regular.
//
// Note [special files]: everything tandem reads or writes by name is
// checked to be what it must be before it is used. A FIFO blocks open()
// until a writer comes, which may be never (a FIFO among an ImageFolder's
// images hung a run with no output), and a device or a folder is not a
// data file. Readers open without blocking (O_NONBLOCK, which for a regular
// file changes nothing) and check the open descriptor, so that no FIFO is
// ever waited on and the check is of the file actually read.
#pragma once

#include <string>

namespace tandem {

// `text` with its control characters written as escapes (\n, \t, \r,
// \xNN): a name printed in a message keeps the message on one line.
std::string printable(const std::string& text);

// What `path` names, following links, in words for a message: "a regular
// file", "a folder", "a FIFO", "a socket", "a character device", "a block
// device", "a link to nothing" or "nothing".
std::string path_kind(const std::string& path);

// Throws tandem::Error "PATH: is KIND; expected EXPECTED" unless `path`
// names a regular file (through links): "PATH: no such file" when nothing
// is there.
void check_regular_file(const std::string& path, const std::string& expected = "a regular file");

// The whole content of the regular file at `path`, opened without blocking
// and checked on its descriptor (Note [special files]). Throws
// tandem::Error naming the path and what it is instead.
std::string read_regular_file(const std::string& path, const std::string& expected = "a regular file");

// Opens `path` to write lines to, as --metrics-out does; returns the file
// descriptor. A regular file is created, or emptied unless `append`. Any
// other writable thing is appended to and never emptied: a terminal, a
// pipe, /dev/null or a FIFO that has a reader. This process's own standard
// output or error by any name (/dev/stdout while it is redirected to a
// file) is that descriptor, duplicated: emptying it would lose what was
// printed before, and a descriptor of its own would write over what is
// printed after (flush stdio before each write). A FIFO with no reader, a
// folder or a block device is refused, naming the path (`flag` before it).
int open_lines_output(const std::string& flag, const std::string& path, bool append);

// Writes all of `bytes` to `fd`, again after an interrupted or short write.
// Throws tandem::Error "WHAT: write failed: REASON" (a full disk, a closed
// pipe).
void write_all(int fd, const std::string& bytes, const std::string& what);

}  // namespace tandem
