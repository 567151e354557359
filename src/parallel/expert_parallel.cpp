// Note [expert dispatch] (expert_parallel.h).
#include "tandem/parallel/expert_parallel.h"

#include <numeric>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::parallel {

namespace {

struct AllToAllRows : public torch::autograd::Function<AllToAllRows> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const std::vector<int64_t>& output_splits, const std::vector<int64_t>& input_splits,
                               dist::ProcessGroup* group) {
    ctx->saved_data["out"] = output_splits;
    ctx->saved_data["in"] = input_splits;
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    auto shape = input.sizes().vec();
    shape[0] = std::accumulate(output_splits.begin(), output_splits.end(), int64_t{0});
    auto output = torch::empty(shape, input.options());
    group->all_to_all(output, input.contiguous(), output_splits, input_splits).wait();
    return output;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto out = ctx->saved_data["out"].toIntVector(), in = ctx->saved_data["in"].toIntVector();
    auto* group = reinterpret_cast<dist::ProcessGroup*>(ctx->saved_data["group"].toInt());
    auto shape = grads[0].sizes().vec();
    shape[0] = std::accumulate(in.begin(), in.end(), int64_t{0});
    auto back = torch::empty(shape, grads[0].options());
    group->all_to_all(back, grads[0].contiguous(), in, out).wait();
    return {back, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor all_to_all_rows(const torch::Tensor& input, const std::vector<int64_t>& output_splits,
                              const std::vector<int64_t>& input_splits, std::shared_ptr<dist::ProcessGroup> group) {
  return AllToAllRows::apply(input, output_splits, input_splits, group.get());
}

void spread_experts(models::SparseMoeImpl& moe, std::shared_ptr<dist::ProcessGroup> group) {
  TANDEM_CHECK(group != nullptr, "expert parallelism needs a group");
  const int64_t ranks = group->size(), rank = group->rank(), experts = moe.config().num_experts;
  TANDEM_CHECK(experts % ranks == 0, "expert parallelism: ", ranks, " ranks do not divide the model's ", experts,
               " experts (ep must divide the experts)");
  const int64_t held = experts / ranks, first = rank * held;
  {
    torch::NoGradGuard no_grad;
    auto& e = *moe.experts;
    for (auto* w : {&e.gate_proj, &e.up_proj, &e.down_proj}) w->set_data(w->slice(0, first, first + held).clone());
  }
  moe.spread.dispatch = [group, ranks, held](const torch::Tensor& grouped, const std::vector<int64_t>& counts,
                                             const models::ExpertSplit::Compute& compute) {
    // 1. The counts: mine per expert of rank j, to rank j; theirs per my expert.
    auto mine = torch::tensor(counts, torch::kInt64);
    auto theirs = torch::empty_like(mine);
    const std::vector<int64_t> per_rank(static_cast<size_t>(ranks), held);
    group->all_to_all(theirs, mine, per_rank, per_rank).wait();
    const int64_t* from = theirs.data_ptr<int64_t>();  // [source][my expert]
    std::vector<int64_t> send(static_cast<size_t>(ranks), 0), receive(static_cast<size_t>(ranks), 0);
    for (int64_t j = 0; j < ranks; ++j) {
      for (int64_t e = 0; e < held; ++e) {
        send[static_cast<size_t>(j)] += counts[static_cast<size_t>(j * held + e)];
        receive[static_cast<size_t>(j)] += from[j * held + e];
      }
    }
    // 2. The rows to their experts' ranks: they arrive by source, then expert.
    const auto arrived = all_to_all_rows(grouped, receive, send, group);
    // 3. By expert (sources in rank order within each), one product each.
    std::vector<int64_t> start(static_cast<size_t>(ranks * held), 0);  // each (source, expert) run's first row
    for (int64_t k = 1; k < ranks * held; ++k) start[static_cast<size_t>(k)] = start[static_cast<size_t>(k - 1)] + from[k - 1];
    std::vector<int64_t> order;
    order.reserve(static_cast<size_t>(arrived.size(0)));
    std::vector<int64_t> rows_per_expert(static_cast<size_t>(held), 0);
    for (int64_t e = 0; e < held; ++e) {
      for (int64_t s = 0; s < ranks; ++s) {
        const int64_t n = from[s * held + e], at = start[static_cast<size_t>(s * held + e)];
        for (int64_t i = at; i < at + n; ++i) order.push_back(i);
        rows_per_expert[static_cast<size_t>(e)] += n;
      }
    }
    const auto by_expert = torch::tensor(order, torch::kInt64).to(grouped.device());
    auto results = compute(arrived.index_select(0, by_expert), rows_per_expert);
    // 4. Back in arrival order, then to their sources.
    auto back = torch::zeros_like(results).index_copy(0, by_expert, results);
    return all_to_all_rows(back, send, receive, group);
  };
}

}  // namespace tandem::parallel
