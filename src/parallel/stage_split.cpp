#include "tandem/parallel/stage_split.h"

#include <algorithm>
#include <limits>

#include <torch/cuda.h>
#include <torch/torch.h>

#include "tandem/parallel/sync_batch_norm.h"
#include "tandem/models/registry.h"
#include "tandem/util/check.h"
#include "tandem/util/parse.h"
#include "tandem/util/stopwatch.h"

namespace tandem::parallel {

std::vector<int64_t> split_at_names(const models::Sequence& model, const std::string& names,
                                    int64_t stages) {
  auto wanted = split(names, ',');
  TANDEM_CHECK(static_cast<int64_t>(wanted.size()) == stages - 1, "--pipeline-split '", names,
               "': expected ", stages - 1, " name(s) of the layers that begin stages 2..", stages,
               ", got ", wanted.size());
  std::string known;
  for (size_t i = 0; i < model->size(); ++i) known += (i ? ", " : "") + model->name(i);
  std::vector<int64_t> sizes;
  int64_t begin = 0;
  for (const auto& name : wanted) {
    int64_t index = -1;
    for (size_t i = 0; i < model->size(); ++i) {
      if (model->name(i) == name) index = static_cast<int64_t>(i);
    }
    TANDEM_CHECK(index >= 0, "--pipeline-split: no layer '", name, "' in the model (its layers: ",
                 known, ")");
    TANDEM_CHECK(index > begin, "--pipeline-split: layer '", name,
                 "' does not come after the previous cut; names must be in model order and "
                 "every stage needs at least one layer");
    sizes.push_back(index - begin);
    begin = index;
  }
  sizes.push_back(static_cast<int64_t>(model->size()) - begin);
  return sizes;
}

std::vector<int64_t> balance_stages(const std::vector<double>& costs, int64_t stages) {
  const auto n = static_cast<int64_t>(costs.size());
  TANDEM_CHECK(stages >= 1, "pipeline: expected at least one stage, got ", stages);
  TANDEM_CHECK(n >= stages, "pipeline: the model has ", n, " layers, fewer than the ", stages,
               " stages; give fewer devices (or a smaller --virtual-stages)");
  std::vector<double> prefix(n + 1, 0.0);
  for (int64_t i = 0; i < n; ++i) {
    TANDEM_CHECK(costs[i] >= 0, "pipeline: negative cost ", costs[i], " for layer ", i);
    prefix[i + 1] = prefix[i] + costs[i];
  }
  auto cost = [&](int64_t from, int64_t to) { return prefix[to] - prefix[from]; };
  // best[k][i]: the smallest largest-stage cost over the first i children
  // in k stages.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  best[0][0] = 0.0;
  for (int64_t k = 1; k <= stages; ++k) {
    for (int64_t i = k; i <= n; ++i) {
      for (int64_t j = k - 1; j < i; ++j) {
        best[k][i] = std::min(best[k][i], std::max(best[k - 1][j], cost(j, i)));
      }
    }
  }
  const double limit = best[stages][n];
  // Greedy from the front under that limit: each stage takes as many
  // children as fit, leaving one for each later stage. (A greedy packing is
  // ahead of any feasible split; where the reserve binds, each later stage
  // gets one child, whose cost is within the limit.)
  std::vector<int64_t> sizes;
  int64_t begin = 0;
  for (int64_t s = 0; s < stages; ++s) {
    int64_t end = begin + 1;
    const int64_t last_allowed = n - (stages - s - 1);
    if (s == stages - 1) {
      end = n;
    } else {
      while (end < last_allowed && cost(begin, end + 1) <= limit) ++end;
    }
    sizes.push_back(end - begin);
    begin = end;
  }
  return sizes;
}

namespace {

// Branch and bound over the pieces' ends for balance_interleaved: device
// loads only grow as pieces are added, so a partial split whose loads
// already exceed the best complete one (or equal it with a larger piece)
// is cut off.
class InterleavedSearch {
 public:
  InterleavedSearch(const std::vector<double>& costs, int64_t stages, int64_t chunks, int64_t budget)
      : n_(static_cast<int64_t>(costs.size())), stages_(stages), pieces_(stages * chunks),
        budget_(budget), prefix_(costs.size() + 1, 0.0), loads_(stages, 0.0) {
    for (size_t i = 0; i < costs.size(); ++i) prefix_[i + 1] = prefix_[i] + costs[i];
  }
  // (largest device load, largest piece) of a split.
  std::pair<double, double> score(const std::vector<int64_t>& sizes) const {
    std::vector<double> loads(stages_, 0.0);
    double piece = 0;
    int64_t begin = 0;
    for (size_t k = 0; k < sizes.size(); ++k) {
      const double c = prefix_[begin + sizes[k]] - prefix_[begin];
      loads[k % stages_] += c;
      piece = std::max(piece, c);
      begin += sizes[k];
    }
    return {*std::max_element(loads.begin(), loads.end()), piece};
  }
  std::vector<int64_t> run(std::vector<int64_t> incumbent) {
    best_ = score(incumbent);
    best_sizes_ = std::move(incumbent);
    sizes_.clear();
    visit(0, 0, 0.0);
    return best_sizes_;
  }

 private:
  void visit(int64_t k, int64_t begin, double largest_piece) {
    if (budget_-- <= 0) return;  // the best split found so far stands
    if (k == pieces_) {
      const double top = *std::max_element(loads_.begin(), loads_.end());
      if (std::make_pair(top, largest_piece) < best_) {
        best_ = {top, largest_piece};
        best_sizes_ = sizes_;
      }
      return;
    }
    const int64_t last_end = k + 1 == pieces_ ? n_ : n_ - (pieces_ - k - 1);
    const int64_t first_end = k + 1 == pieces_ ? n_ : begin + 1;
    auto& load = loads_[k % stages_];
    for (int64_t end = first_end; end <= last_end; ++end) {
      const double c = prefix_[end] - prefix_[begin];
      const double piece = std::max(largest_piece, c);
      // Loads only grow with `end`: nothing further along can do better.
      if (std::make_pair(load + c, piece) >= best_ && load + c >= best_.first) break;
      load += c;
      sizes_.push_back(end - begin);
      visit(k + 1, end, piece);
      sizes_.pop_back();
      load -= c;
    }
  }

  int64_t n_, stages_, pieces_, budget_;
  std::vector<double> prefix_, loads_;
  std::vector<int64_t> sizes_, best_sizes_;
  std::pair<double, double> best_;
};

}  // namespace

std::vector<int64_t> balance_interleaved(const std::vector<double>& costs, int64_t stages,
                                         int64_t chunks, int64_t budget) {
  TANDEM_CHECK(chunks >= 1, "--virtual-stages: expected at least 1, got ", chunks);
  auto start = balance_stages(costs, stages * chunks);  // checks the counts and costs
  if (chunks == 1) return start;
  return InterleavedSearch(costs, stages, chunks, budget).run(std::move(start));
}

std::vector<double> parameter_costs(const models::Sequence& model) {
  std::vector<double> costs;
  for (size_t i = 0; i < model->size(); ++i) {
    double count = 0;
    for (const auto& p : model->at(i).ptr()->parameters()) count += static_cast<double>(p.numel());
    costs.push_back(count);
  }
  return costs;
}

std::vector<double> measured_costs(const models::Sequence& model, const torch::Tensor& sample,
                                   const MeasureOptions& options) {
  TANDEM_CHECK(options.min_repeats >= 1 && options.min_repeats <= options.max_repeats,
               "measured_costs: expected 1 <= min_repeats <= max_repeats, got ",
               options.min_repeats, " and ", options.max_repeats);
  TANDEM_CHECK(options.budget_seconds >= 0, "measured_costs: expected a budget >= 0 seconds, got ",
               options.budget_seconds);
  models::Sequence copy{nullptr};
  {
    auto held = models::hold_default_generator();  // clone() draws new weights before it copies
    copy = models::Sequence(std::dynamic_pointer_cast<models::SequenceImpl>(model->clone(sample.device())));
  }
  // One rank measures alone: its SyncBatchNorm layers must not wait for the others.
  for (const auto& module : copy->modules()) {
    if (auto* bn = dynamic_cast<SyncBatchNormImpl*>(module.get())) bn->use_local_statistics();
  }
  const size_t n = copy->size();
  std::vector<std::vector<double>> seconds(n);
  auto sync = [&] {
    if (sample.is_cuda()) torch::cuda::synchronize(sample.device().index());
  };
  // As in training, a child's input needs a gradient only when some child
  // before it has parameters that do: the first layer's backward computes
  // no gradient for the data.
  std::vector<bool> input_needs_grad(n, false);
  for (size_t i = 1; i < n; ++i) {
    bool before = input_needs_grad[i - 1];
    for (const auto& p : copy->at(i - 1).ptr()->parameters()) before = before || p.requires_grad();
    input_needs_grad[i] = before;
  }
  Stopwatch timed;  // restarted after the warm-up pass
  for (int64_t r = 0;; ++r) {  // the first pass warms up
    if (r == 1) timed = Stopwatch();
    if (r > options.min_repeats &&
        (r > options.max_repeats || timed.seconds() >= options.budget_seconds)) {
      break;
    }
    torch::Tensor x = sample;
    for (size_t i = 0; i < n; ++i) {
      x = x.detach();
      if (input_needs_grad[i] && x.is_floating_point()) x.requires_grad_(true);
      x = copy->input_for(i, x);  // Note [a stage that starts in place]
      sync();
      Stopwatch clock;
      auto y = copy->at(i).forward(x);
      if (y.requires_grad()) y.backward(torch::ones_like(y));
      sync();
      if (r > 0) seconds[i].push_back(clock.seconds());
      x = y.detach();
    }
  }
  // The least time of each child: other work on the machine only ever adds
  // to a measurement, and a median of three still takes two passes that it
  // hit (as on a loaded CI machine, where conv1 once measured as heavier
  // than the rest of convnet together). Even the least of three passes was
  // hit once (CI, 2026-11-25: conv1 put alone in stage 0, which then idled
  // 81% of the time), hence the extra passes a cheap model gets.
  std::vector<double> costs;
  for (auto& s : seconds) costs.push_back(*std::min_element(s.begin(), s.end()));
  return costs;
}

std::vector<models::Sequence> split_sequence(const models::Sequence& model,
                                             const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (auto size : sizes) {
    TANDEM_CHECK(size > 0, "pipeline: every stage needs at least one layer");
    total += size;
  }
  TANDEM_CHECK(total == static_cast<int64_t>(model->size()), "pipeline: the stages hold ", total,
               " layers but the model has ", model->size());
  std::vector<models::Sequence> stages;
  size_t next = 0;
  for (auto size : sizes) {
    models::Sequence stage;
    for (int64_t k = 0; k < size; ++k, ++next) stage->push_back_any(model->name(next), model->at(next));
    stage->train(model->is_training());
    stages.push_back(stage);
  }
  return stages;
}

std::string describe_split(const models::Sequence& model, const std::vector<int64_t>& sizes) {
  std::string text;
  size_t next = 0;
  for (auto size : sizes) {
    if (!text.empty()) text += " | ";
    text += model->name(next);
    if (size > 1) text += ".." + model->name(next + size - 1);
    next += size;
  }
  return text;
}

}  // namespace tandem::parallel
