// tandem/cli/flags.h: one table of flags drives both parsing and --help.
//
// Each flag binds to a field of an options struct; its default is whatever the
// field holds when the table is built, so --help always shows the real
// default. parse() accepts "--name value" and "--name=value"; an unknown flag
// or a bad value throws UsageError with one line naming the flag.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/util/check.h"

namespace tandem::cli {

// A mistake on the command line (exit code 2): tandem::UsageError (util/check.h).
using ::tandem::UsageError;

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  void add_int(const std::string& name, const std::string& metavar, int64_t* target,
               const std::string& help, int64_t min_value = INT64_MIN);
  void add_uint(const std::string& name, const std::string& metavar, uint64_t* target,
                const std::string& help);
  // `expected` (when not empty) says what the bounds allow in an error's
  // words, e.g. "a positive number up to 1e+300" where 0 itself is refused
  // later.
  void add_double(const std::string& name, const std::string& metavar, double* target,
                  const std::string& help, double min_value = -1e300, double max_value = 1e300,
                  const std::string& expected = "");
  void add_string(const std::string& name, const std::string& metavar, std::string* target,
                  const std::string& help);
  // A value of a type of its own, made from the text by `parse` (which
  // throws UsageError naming the flag for a bad one); `current`: the
  // default's text for --help. An empty value is refused, as add_string's.
  void add_parsed(const std::string& name, const std::string& metavar, const std::string& current,
                  const std::string& help, std::function<void(const std::string&)> parse);
  void add_choice(const std::string& name, std::string* target,
                  const std::vector<std::string>& choices, const std::string& help);
  // A choice parsed into an enum: `names` maps each word to its value.
  template <typename E>
  void add_enum(const std::string& name, E* target, const std::vector<std::pair<std::string, E>>& names,
                const std::string& help) {
    std::string metavar, current;
    for (const auto& [word, value] : names) {
      metavar += (metavar.empty() ? "" : "|") + word;
      if (value == *target) current = word;
    }
    Flag flag{name, metavar, help, current};
    flag.set = [target, names, name, metavar](const std::string& value) {
      for (const auto& [word, e] : names) {
        if (word == value) {
          *target = e;
          return;
        }
      }
      throw UsageError("--" + name + ": expected one of " + metavar + ", got '" + value + "'");
    };
    add(std::move(flag));
  }
  // A switch: present means true; takes no value.
  void add_switch(const std::string& name, bool* target, const std::string& help);
  // A heading in --help before the flags added next.
  void section(const std::string& title);

  // Parses `args` (without the program and command names). "--help" or "-h"
  // sets help_requested() and stops. Throws UsageError.
  void parse(const std::vector<std::string>& args);
  bool help_requested() const { return help_requested_; }
  // Whether the flag was given on the command line.
  bool given(const std::string& name) const;

  std::string help() const;

  // What each flag is, for job files (config_file.h): its name, the
  // section --help lists it under ("" before the first), whether a switch.
  struct FlagInfo {
    std::string name, section;
    bool is_switch = false;
  };
  std::vector<FlagInfo> flag_infos() const;

 private:
  struct Flag {
    std::string name, metavar, help, default_text;
    bool is_switch = false;
    bool given = false;
    std::function<void(const std::string&)> set{};  // throws UsageError
    int section = -1;
  };
  void add(Flag flag);

  std::string command_, summary_;
  std::vector<Flag> flags_;
  std::vector<std::string> sections_;
  bool help_requested_ = false;
};

}  // namespace tandem::cli
