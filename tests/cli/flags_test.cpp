#include <gtest/gtest.h>

#include "tandem/cli/flags.h"

namespace tandem::cli {
namespace {

struct Options {
  int64_t epochs = 5;
  double lr = 0.1;
  double grace = 5;
  std::string name = "x";
  std::string mode = "a";
  bool fast = false;
};

FlagSet make(Options& o) {
  FlagSet flags("tool", "A tool.");
  flags.add_int("epochs", "N", &o.epochs, "epochs", 1);
  flags.add_double("lr", "X", &o.lr, "learning rate", 0);
  flags.add_double("grace", "S", &o.grace, "seconds", 0, 86400);
  flags.add_string("name", "S", &o.name, "a name");
  flags.add_choice("mode", &o.mode, {"a", "b"}, "a mode");
  flags.add_switch("fast", &o.fast, "go fast");
  return flags;
}

std::string usage_error(const std::vector<std::string>& args) {
  Options o;
  auto flags = make(o);
  try {
    flags.parse(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(FlagsTest, ParsesBothFormsAndSwitches) {
  Options o;
  auto flags = make(o);
  flags.parse({"--epochs", "3", "--lr=0.5", "--name=--odd", "--mode=b", "--fast"});
  EXPECT_EQ(o.epochs, 3);
  EXPECT_DOUBLE_EQ(o.lr, 0.5);
  EXPECT_EQ(o.name, "--odd");
  EXPECT_EQ(o.mode, "b");
  EXPECT_TRUE(o.fast);
  EXPECT_TRUE(flags.given("lr"));
  EXPECT_FALSE(flags.help_requested());
}

TEST(FlagsTest, MistakesAreOneLineNamingTheFlag) {
  EXPECT_EQ(usage_error({"--epoch", "3"}), "unknown flag --epoch (see tool --help)");
  EXPECT_EQ(usage_error({"--epochs", "0"}), "--epochs: expected a positive integer, got '0'");
  EXPECT_EQ(usage_error({"--epochs", "three"}), "--epochs: expected a positive integer, got 'three'");
  EXPECT_EQ(usage_error({"--lr", "-1"}), "--lr: expected a number from 0 to 1e+300, got '-1'");
  // An upper bound too: a huge time would overflow the clock it is added to.
  EXPECT_EQ(usage_error({"--grace", "1e10"}), "--grace: expected a number from 0 to 86400, got '1e10'");
  EXPECT_EQ(usage_error({"--lr", "nan"}), "--lr: expected a number >= 0, got 'nan'");
  // A number out of range is told the range, not that it is no number;
  // 1e309 overflows a double.
  EXPECT_EQ(usage_error({"--lr", "1e308"}), "--lr: expected a number from 0 to 1e+300, got '1e308'");
  EXPECT_EQ(usage_error({"--lr", "1e309"}), "--lr: expected a number from 0 to 1e+300, got '1e309'");
  EXPECT_EQ(usage_error({"--mode", "c"}), "--mode: expected one of a|b, got 'c'");
  EXPECT_EQ(usage_error({"--fast=yes"}), "--fast takes no value, got 'yes'");
  EXPECT_EQ(usage_error({"--epochs"}), "--epochs: missing value (N)");
  // A forgotten value does not take the next flag for one (a file named
  // --fast, and the switch lost).
  EXPECT_EQ(usage_error({"--name", "--fast"}),
            "--name: missing value (S); the next argument, '--fast', is a flag (--name=--fast gives a value "
            "that starts with --)");
  EXPECT_EQ(usage_error({"--epochs", "0x10"}), "--epochs: expected a positive integer, got '0x10'");
  EXPECT_EQ(usage_error({"--lr", " 0.1"}), "--lr: expected a number >= 0, got ' 0.1'");
  EXPECT_EQ(usage_error({"stray"}), "unexpected argument 'stray' (flags start with --; see tool --help)");
  // An empty string (an unset shell variable) would read as the flag left
  // out: --checkpoint-dir "$DIR" writing no checkpoints.
  EXPECT_EQ(usage_error({"--name", ""}), "--name: expected S, got an empty value");
  EXPECT_EQ(usage_error({"--name="}), "--name: expected S, got an empty value");
}

TEST(FlagsTest, HelpListsEveryFlagWithItsDefault) {
  Options o;
  o.lr = 0.25;
  auto help = make(o).help();
  EXPECT_NE(help.find("--epochs N"), std::string::npos) << help;
  EXPECT_NE(help.find("(default: 5)"), std::string::npos) << help;
  EXPECT_NE(help.find("(default: 0.25)"), std::string::npos) << help;
  EXPECT_NE(help.find("--mode a|b"), std::string::npos) << help;
  EXPECT_NE(help.find("--fast"), std::string::npos) << help;
  Options h;
  auto flags = make(h);
  flags.parse({"--epochs", "2", "--help", "--bogus"});
  EXPECT_TRUE(flags.help_requested());
}

}  // namespace
}  // namespace tandem::cli
