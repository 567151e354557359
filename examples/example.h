// examples/example.h: what the example programs share: their flags, their
// data (a small regression that trains in seconds), a checksum of a model's
// weights, and main()'s error handling. Header-only, on tandem's headers.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <string>

#include <torch/torch.h>

#include <tandem/tandem.h>

namespace example {

// `--name value` pairs, each name one of the defaults' keys.
class Flags {
 public:
  Flags(int argc, char** argv, std::map<std::string, std::string> defaults) : values_(std::move(defaults)) {
    for (int i = 1; i < argc; ++i) {
      std::string flag = argv[i];
      if (flag == "--help") {
        std::printf("usage: %s", argv[0]);
        for (const auto& [name, value] : values_) std::printf(" [--%s %s]", name.c_str(), value.c_str());
        std::printf("\n");
        std::exit(0);
      }
      auto found = flag.rfind("--", 0) == 0 ? values_.find(flag.substr(2)) : values_.end();
      if (found == values_.end()) throw tandem::UsageError("unknown flag '" + flag + "' (--help lists them)");
      if (i + 1 >= argc) throw tandem::UsageError(flag + ": expected a value");
      found->second = argv[++i];
    }
  }
  const std::string& text(const std::string& name) const { return values_.at(name); }
  int64_t positive(const std::string& name) const {
    const std::string& value = text(name);
    char* end = nullptr;
    long long number = std::strtoll(value.c_str(), &end, 10);
    TANDEM_CHECK_USAGE(!value.empty() && *end == '\0' && number > 0, "--", name,
                       ": expected a positive integer, got '", value, "'");
    return number;
  }

 private:
  std::map<std::string, std::string> values_;
};

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
