// Job files for tandem train --config (config_file.h, Note [job files]).
#include "config_file.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <toml++/toml.h>

#include "tandem/util/atomic_file.h"
#include "tandem/util/file.h"
#include "tandem/util/table.h"

namespace tandem::cli {
namespace {

const FlagSet::FlagInfo* find_flag(const std::vector<FlagSet::FlagInfo>& infos, const std::string& name) {
  for (const auto& f : infos) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// The flag names a command line gives ("--lr 0.1", "--lr=0.1", "--nesterov").
std::vector<std::string> given_names(const std::vector<std::string>& args) {
  std::vector<std::string> names;
  for (const auto& a : args) {
    if (a.rfind("--", 0) != 0 || a.size() == 2) continue;
    names.push_back(a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2));
  }
  return names;
}

// A scalar's text as the flag takes it.
std::string scalar_text(const toml::node& node, const std::string& where) {
  if (const auto* s = node.as_string()) return s->get();
  if (const auto* i = node.as_integer()) return std::to_string(i->get());
  if (const auto* d = node.as_floating_point()) return format("%.17g", d->get());
  throw UsageError(where + ": expected a string or a number");
}

}  // namespace

std::vector<std::string> with_config_file(const std::vector<std::string>& args, const FlagSet& flags,
                                          std::map<std::string, std::string>* origins) {
  std::vector<std::string> rest;
  std::string file;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--config") {
      TANDEM_CHECK_USAGE(i + 1 < args.size(), "--config: missing value (FILE.toml)");
      value = args[++i];
    } else if (args[i].rfind("--config=", 0) == 0) {
      value = args[i].substr(9);
    } else {
      rest.push_back(args[i]);
      continue;
    }
    TANDEM_CHECK_USAGE(file.empty(), "--config is given twice (", file, ", ", value, "): one job file a run");
    TANDEM_CHECK_USAGE(!value.empty(), "--config: expected a TOML job file");
    file = value;
  }
  if (file.empty()) return args;
  std::error_code ec;
  TANDEM_CHECK_USAGE(std::filesystem::is_regular_file(file, ec), "--config ", file, ": ", path_kind(file),
                     ", not a TOML job file");
  const auto text = read_regular_file(file, "a TOML job file");
  toml::table root;
  try {
    root = toml::parse(text, file);
  } catch (const toml::parse_error& e) {
    throw UsageError("--config " + file + ": not TOML (line " + std::to_string(e.source().begin.line) + ": " +
                     std::string(e.description()) + ")");
  }
  const auto infos = flags.flag_infos();
  const auto given = given_names(rest);
  std::vector<std::string> out;
  std::map<std::string, std::string> seen;  // flag -> the key that gave it
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const auto* table = section_node.as_table();
    TANDEM_CHECK_USAGE(table != nullptr, "--config ", file, ": \"", section, "\" is not a section ([data], "
                       "[model], [optimisation], [distributed] or [run], as tandem train --help lists the flags)");
    for (const auto& [key_node, node] : *table) {
      const std::string key(key_node.str());
      std::string name = key;
      for (auto& c : name) c = c == '_' ? '-' : c;
      const std::string where = "--config " + file + ": [" + section + "] " + key;
      TANDEM_CHECK_USAGE(name != "config", where, ": a job file does not name another");
      const auto* flag = find_flag(infos, name);
      TANDEM_CHECK_USAGE(flag != nullptr, where, ": unknown flag (see tandem train --help)");
      TANDEM_CHECK_USAGE(flag->section == section, where, ": --", name, " belongs in [", flag->section, "]");
      TANDEM_CHECK_USAGE(seen.emplace(name, key).second, where, ": --", name, " is given twice (as ", seen[name],
                         " and ", key, ")");
      if (std::find(given.begin(), given.end(), name) != given.end()) continue;  // the command line's wins
      if (origins) (*origins)[name] = where;
      if (flag->is_switch) {
        const auto* b = node.as_boolean();
        TANDEM_CHECK_USAGE(b != nullptr, where, ": a switch takes true or false");
        if (b->get()) out.push_back("--" + name);
        continue;
      }
      TANDEM_CHECK_USAGE(!node.as_boolean(), where, ": --", name, " takes a value, not true or false");
      TANDEM_CHECK_USAGE(!node.as_table(), where, ": a table inside a section is not a flag");
      std::string value;
      if (const auto* array = node.as_array()) {
        TANDEM_CHECK_USAGE(!array->empty(), where, ": an empty list");
        for (const auto& item : *array) value += (value.empty() ? "" : ",") + scalar_text(item, where);
      } else {
        value = scalar_text(node, where);
      }
      out.push_back("--" + name + "=" + value);
    }
  }
  out.insert(out.end(), rest.begin(), rest.end());
  return out;
}

void parse_with_origins(FlagSet& flags, const std::vector<std::string>& args,
                        const std::map<std::string, std::string>& origins) {
  try {
    flags.parse(args);
  } catch (const UsageError& e) {
    const std::string message = e.what();
    for (const auto& [name, where] : origins) {
      const std::string flag = "--" + name;
      const bool names_it = message.rfind(flag, 0) == 0 &&
                            (message.size() == flag.size() || message[flag.size()] == ':' || message[flag.size()] == ' ');
      if (names_it) throw UsageError(where + ": " + message);
    }
    throw;
  }
}

std::string config_text(const std::vector<std::string>& args, const FlagSet& flags) {
  const auto infos = flags.flag_infos();
  std::map<std::string, toml::table> sections;
  std::vector<std::string> order;
  for (size_t i = 0; i < args.size(); ++i) {
    const auto& a = args[i];
    if (a.rfind("--", 0) != 0) continue;
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const auto* flag = find_flag(infos, name);
    if (flag == nullptr) continue;  // parse() refused it before this is reached
    if (std::find(order.begin(), order.end(), flag->section) == order.end()) order.push_back(flag->section);
    std::string key = name;
    for (auto& c : key) c = c == '-' ? '_' : c;
    if (flag->is_switch) {
      sections[flag->section].insert_or_assign(key, true);
      continue;
    }
    if (eq == std::string::npos && i + 1 < args.size()) value = args[++i];
    sections[flag->section].insert_or_assign(key, value);
  }
  std::ostringstream text;
  text << "# tandem train's effective configuration: tandem train --config with this file repeats the\n"
       << "# run (docs/TRAINING.md, job files); its paths are as given, from the folder it ran in.\n";
  for (const auto& section : order) {
    toml::table one;
    one.insert(section, sections[section]);
    text << "\n" << one << "\n";
  }
  return text.str();
}

}  // namespace tandem::cli
