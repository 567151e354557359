// examples/example.h: what the example programs share: flag parsing, their
// data (a small regression that trains in seconds), a checksum of a model's
// weights, and main()'s error handling. Header-only, on tandem's headers.
#pragma once

#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include <tandem/cli/flags.h>
#include <tandem/tandem.h>

namespace example {

// Parses argv with tandem's own flag table (tandem/cli/flags.h: one table
// for parsing and --help; a bad value is a UsageError naming the flag).
// False after printing the help for --help: main() then returns 0.
inline bool parse_flags(tandem::cli::FlagSet& flags, int argc, char** argv) {
  flags.parse(std::vector<std::string>(argv + 1, argv + argc));
  if (!flags.help_requested()) return true;
  std::printf("%s", flags.help().c_str());
  return false;
}

// 1024 points of y = sin(x . w) + 0.05 noise, x in R^8: the same in every
// process and on every call.
struct Data {
  torch::Tensor x, y;
};
inline Data regression_data() {
  torch::manual_seed(1234);
  auto x = torch::randn({1024, 8});
  auto w = torch::randn({8, 1}) / 3;
  return {x, torch::sin(x.mm(w)) + 0.05 * torch::randn({1024, 1})};
}

// "weights sum S, sum of squares Q": equal on ranks with equal weights.
inline std::string checksum(const torch::nn::Module& model) {
  double sum = 0, squares = 0;
  for (const auto& p : model.parameters()) {
    sum += p.sum().item<double>();
    squares += p.square().sum().item<double>();
  }
  char text[96];
  std::snprintf(text, sizeof text, "weights sum %.9g, sum of squares %.9g", sum, squares);
  return text;
}

// Rank 0 prints "epoch E: loss L", L the mean over the ranks of each rank's
// mean loss over its `steps` steps. Every rank calls it (a collective).
inline void print_epoch_loss(tandem::dist::ProcessGroup& group, int64_t epoch, double loss_sum, int64_t steps) {
  auto mean = torch::tensor({loss_sum / static_cast<double>(steps)}, torch::kFloat64);
  group.all_reduce(mean, tandem::dist::ReduceOp::kAvg).wait();
  if (group.rank() == 0) std::printf("epoch %lld: loss %.6f\n", static_cast<long long>(epoch), mean.item<double>());
}

// Every rank prints "rank R of W: weights sum S, sum of squares Q".
inline void print_rank_checksum(const tandem::dist::ProcessGroup& group, const torch::nn::Module& model) {
  std::printf("rank %lld of %lld: %s\n", static_cast<long long>(group.rank()), static_cast<long long>(group.size()),
              checksum(model).c_str());
}

// The largest |a - b| over the parameters, taken in order, relative to the
// largest |a|: how far two copies of one model trained apart.
inline double relative_difference(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  TANDEM_CHECK(pa.size() == pb.size(), "the two models have ", pa.size(), " and ", pb.size(), " parameters");
  double diff = 0, scale = 0;
  for (size_t k = 0; k < pa.size(); ++k) {
    diff = std::max(diff, (pa[k].cpu() - pb[k].cpu()).abs().max().item<double>());
    scale = std::max(scale, pa[k].abs().max().item<double>());
  }
  return diff / scale;
}

// `to`'s parameters set to `from`'s, taken in order (names may differ).
inline void copy_weights(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto pf = from.parameters(), pt = to.parameters();
  TANDEM_CHECK(pf.size() == pt.size(), "the two models have ", pf.size(), " and ", pt.size(), " parameters");
  for (size_t k = 0; k < pf.size(); ++k) pt[k].copy_(pf[k]);
}

// main()'s body, with errors as tandem's own: one line, exit 2 for a usage
// mistake, 1 for anything else.
inline int run(const char* program, const std::function<int()>& body) {
  try {
    return body();
  } catch (const tandem::UsageError& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace example
