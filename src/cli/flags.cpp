#include "tandem/cli/flags.h"

#include <algorithm>
#include <sstream>

#include "tandem/util/parse.h"
#include "tandem/util/table.h"

namespace tandem::cli {

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::add(Flag flag) {
  for (const auto& f : flags_) {
    TANDEM_CHECK(f.name != flag.name, "flag --", flag.name, " defined twice");
  }
  flag.section = static_cast<int>(sections_.size()) - 1;
  flags_.push_back(std::move(flag));
}

void FlagSet::section(const std::string& title) { sections_.push_back(title); }

void FlagSet::add_int(const std::string& name, const std::string& metavar, int64_t* target,
                      const std::string& help, int64_t min_value) {
  Flag flag{name, metavar, help, std::to_string(*target)};
  std::string expected = min_value == 0   ? "a non-negative integer"
                         : min_value == 1 ? "a positive integer"
                                          : "an integer";
  flag.set = [target, min_value, expected, name](const std::string& value) {
    auto parsed = parse_int(value);
    if (!parsed || *parsed < min_value) {
      throw UsageError("--" + name + ": expected " + expected + ", got '" + value + "'");
    }
    *target = *parsed;
  };
  add(std::move(flag));
}

void FlagSet::add_uint(const std::string& name, const std::string& metavar, uint64_t* target,
                       const std::string& help) {
  Flag flag{name, metavar, help, std::to_string(*target)};
  flag.set = [target, name](const std::string& value) {
    auto parsed = parse_uint(value);
    if (!parsed) {
      throw UsageError("--" + name + ": expected an integer from 0 to 18446744073709551615, got '" + value + "'");
    }
    *target = static_cast<uint64_t>(*parsed);
  };
  add(std::move(flag));
}

void FlagSet::add_double(const std::string& name, const std::string& metavar, double* target,
                         const std::string& help, double min_value, double max_value,
                         const std::string& expected_text) {
  Flag flag{name, metavar, help, format("%g", *target)};
  flag.set = [target, name, min_value, max_value, expected_text](const std::string& value) {
    auto parsed = parse_double(value);
    if (!parsed || *parsed < min_value || *parsed > max_value) {
      // A number out of range (1e308, or 1e309, which is infinite in a
      // double) is told its range; text that is no number, what a number is.
      const bool a_number = parsed || looks_like_number(value);
      std::string expected = format("a number from %g to %g", min_value, max_value);
      if (!a_number) {
        expected = "a number";
        if (min_value > -1e300 && max_value < 1e300) {
          expected = format("a number from %g to %g", min_value, max_value);
        } else if (min_value > -1e300) {
          expected = format("a number >= %g", min_value);
        } else if (max_value < 1e300) {
          expected = format("a number <= %g", max_value);
        }
      }
      if (!expected_text.empty()) expected = expected_text;
      throw UsageError("--" + name + ": expected " + expected + ", got '" + value + "'");
    }
    *target = *parsed;
  };
  add(std::move(flag));
}

void FlagSet::add_string(const std::string& name, const std::string& metavar,
                         std::string* target, const std::string& help) {
  Flag flag{name, metavar, help, target->empty() ? "" : *target};
  // An empty value is a mistake (an unset shell variable, say) that would
  // otherwise read as the flag left out: no checkpoints, no metrics file.
  flag.set = [target, name, metavar](const std::string& value) {
    if (value.empty()) throw UsageError("--" + name + ": expected " + metavar + ", got an empty value");
    *target = value;
  };
  add(std::move(flag));
}

void FlagSet::add_parsed(const std::string& name, const std::string& metavar, const std::string& current,
                         const std::string& help, std::function<void(const std::string&)> parse) {
  Flag flag{name, metavar, help, current};
  flag.set = [parse = std::move(parse), name, metavar](const std::string& value) {
    if (value.empty()) throw UsageError("--" + name + ": expected " + metavar + ", got an empty value");
    parse(value);
  };
  add(std::move(flag));
}

void FlagSet::add_choice(const std::string& name, std::string* target,
                         const std::vector<std::string>& choices, const std::string& help) {
  std::string metavar;
  for (const auto& c : choices) metavar += (metavar.empty() ? "" : "|") + c;
  Flag flag{name, metavar, help, *target};
  flag.set = [target, choices, name, metavar](const std::string& value) {
    if (std::find(choices.begin(), choices.end(), value) == choices.end()) {
      throw UsageError("--" + name + ": expected one of " + metavar + ", got '" + value + "'");
    }
    *target = value;
  };
  add(std::move(flag));
}

void FlagSet::add_switch(const std::string& name, bool* target, const std::string& help) {
  Flag flag{name, "", help, *target ? "on" : ""};
  flag.is_switch = true;
  flag.set = [target](const std::string&) { *target = true; };
  add(std::move(flag));
}

void FlagSet::parse(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--help" || arg == "-h") {
      help_requested_ = true;
      return;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      throw UsageError("unexpected argument '" + arg + "' (flags start with --; see " +
                       command_ + " --help)");
    }
    std::string name = arg.substr(2);
    std::optional<std::string> value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    auto flag = std::find_if(flags_.begin(), flags_.end(),
                             [&](const Flag& f) { return f.name == name; });
    if (flag == flags_.end()) {
      throw UsageError("unknown flag --" + name + " (see " + command_ + " --help)");
    }
    if (flag->is_switch) {
      if (value) throw UsageError("--" + name + " takes no value, got '" + *value + "'");
    } else if (!value) {
      if (i + 1 >= args.size()) {
        throw UsageError("--" + name + ": missing value (" + flag->metavar + ")");
      }
      // "--metrics-out --nesterov": the flag's value forgotten, not a file
      // named --nesterov (which would also swallow the switch).
      if (args[i + 1].rfind("--", 0) == 0) {
        throw UsageError("--" + name + ": missing value (" + flag->metavar + "); the next argument, '" +
                         args[i + 1] + "', is a flag (--" + name + "=" + args[i + 1] +
                         " gives a value that starts with --)");
      }
      value = args[++i];
    }
    flag->set(value.value_or(""));
    flag->given = true;
  }
}

std::vector<FlagSet::FlagInfo> FlagSet::flag_infos() const {
  std::vector<FlagInfo> out;
  for (const auto& f : flags_) out.push_back({f.name, f.section >= 0 ? sections_[f.section] : "", f.is_switch});
  return out;
}

bool FlagSet::given(const std::string& name) const {
  for (const auto& f : flags_) {
    if (f.name == name) return f.given;
  }
  return false;
}

std::string FlagSet::help() const {
  std::ostringstream out;
  out << "usage: " << command_ << " [flags]\n\n" << summary_ << "\n";
  size_t width = 0;
  for (const auto& f : flags_) {
    width = std::max(width, f.name.size() + (f.metavar.empty() ? 0 : f.metavar.size() + 1));
  }
  int section = -2;
  for (const auto& f : flags_) {
    if (f.section != section) {
      section = f.section;
      out << "\n" << (section >= 0 ? sections_[section] : std::string("flags")) << ":\n";
    }
    std::string left = f.name + (f.metavar.empty() ? "" : " " + f.metavar);
    out << "  --" << left << std::string(width - left.size() + 2, ' ') << f.help;
    if (!f.default_text.empty()) out << " (default: " << f.default_text << ")";
    out << "\n";
  }
  return out.str();
}

}  // namespace tandem::cli
