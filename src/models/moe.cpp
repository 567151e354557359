// Note [dropless grouped experts], Note [routing in float64] (moe.h).
#include "tandem/models/moe.h"

#include <utility>

#include <torch/torch.h>

#include "tandem/util/check.h"

namespace tandem::models {

namespace {

torch::Tensor normal_weight(std::vector<int64_t> shape) {
  torch::NoGradGuard no_grad;
  return torch::empty(shape).normal_(0.0, 0.02);  // transformers' initializer_range
}

}  // namespace

void MoeConfig::check() const {
  TANDEM_CHECK(hidden_size > 0 && intermediate_size > 0 && num_experts > 0 && experts_per_token > 0,
               "mixture of experts: sizes must be positive");
  TANDEM_CHECK(experts_per_token <= num_experts, "mixture of experts: each token goes to ", experts_per_token,
               " experts of ", num_experts);
}

TopKRouterImpl::TopKRouterImpl(MoeConfig config) : config_(config) { reset(); }

void TopKRouterImpl::reset() {
  weight = register_parameter("weight", normal_weight({config_.num_experts, config_.hidden_size}));
}

TopKRouterImpl::Routing TopKRouterImpl::route(const torch::Tensor& rows) {
  const auto logits = torch::linear(rows, weight);
  const auto wide = at::promote_types(logits.scalar_type(), torch::kFloat32);
  Routing r;
  r.probabilities = torch::softmax(logits.to(wide), -1);
  auto [top, experts] = torch::topk(r.probabilities, config_.experts_per_token, -1);
  if (config_.normalize_top_k) top = top / top.sum(-1, /*keepdim=*/true);
  r.weights = top.to(rows.scalar_type());
  r.experts = experts;
  return r;
}

GroupedExpertsImpl::GroupedExpertsImpl(MoeConfig config) : config_(config) { reset(); }

void GroupedExpertsImpl::reset() {
  const int64_t e = config_.num_experts, i = config_.intermediate_size, h = config_.hidden_size;
  gate_proj = register_parameter("gate_proj", normal_weight({e, i, h}));
  up_proj = register_parameter("up_proj", normal_weight({e, i, h}));
  down_proj = register_parameter("down_proj", normal_weight({e, h, i}));
}

torch::Tensor GroupedExpertsImpl::forward(const torch::Tensor& grouped, const std::vector<int64_t>& counts) {
  TANDEM_CHECK(static_cast<int64_t>(counts.size()) == gate_proj.size(0), "mixture of experts: ", counts.size(),
               " counts for ", gate_proj.size(0), " experts held");
  const auto parts = grouped.split_with_sizes(counts, 0);
  std::vector<torch::Tensor> out;
  out.reserve(parts.size());
  for (size_t e = 0; e < parts.size(); ++e) {  // one product per projection and expert, however many rows
    const auto& rows = parts[e];
    const auto g = torch::matmul(rows, gate_proj[e].t()), u = torch::matmul(rows, up_proj[e].t());
    out.push_back(torch::matmul(torch::silu(g) * u, down_proj[e].t()));
  }
  return torch::cat(out, 0);
}

SparseMoeImpl::SparseMoeImpl(MoeConfig config) : config_(config) {
  config_.check();
  reset();
}

void SparseMoeImpl::reset() {
  gate = register_module("gate", TopKRouter(config_));
  experts = register_module("experts", GroupedExperts(config_));
  routed_ = {};
}

torch::Tensor SparseMoeImpl::forward(const torch::Tensor& x) {
  const auto in = split.in(x);  // tensor parallelism: the whole sequence, replicated
  const int64_t hidden = in.size(-1), k = config_.experts_per_token, n_experts = config_.num_experts;
  const auto rows = in.reshape({-1, hidden});
  const auto routing = gate->route(rows);
  const auto chosen = routing.experts.reshape({-1});  // [rows * k], row-major: token t's k experts
  const auto order = std::get<1>(chosen.sort(/*stable=*/true, /*dim=*/0, /*descending=*/false));
  const auto token = order.div(k, "floor");
  const auto counts = torch::bincount(chosen, /*weights=*/{}, n_experts);
  const auto host = counts.cpu();
  // A checkpointed layer's first forward (no graph) is run again in
  // backward: counted then, once.
  if (is_training() && torch::GradMode::is_enabled()) record(host, routing.probabilities, rows.size(0));
  const auto grouped = rows.index_select(0, token);
  const std::vector<int64_t> per_expert(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + n_experts);
  ExpertSplit::Compute compute = [this](const torch::Tensor& g, const std::vector<int64_t>& c) {
    return experts->forward(g, c);
  };
  auto y = spread.split() ? spread.dispatch(grouped, per_expert, compute) : compute(grouped, per_expert);
  y = y * routing.weights.reshape({-1}).index_select(0, order).unsqueeze(1);
  const auto out = torch::zeros_like(rows).index_add(0, token, y);
  return split.out(out.view(in.sizes()));
}

void SparseMoeImpl::record(const torch::Tensor& counts, const torch::Tensor& probabilities, int64_t rows) {
  torch::NoGradGuard no_grad;
  const auto pairs = counts.to(torch::kFloat64);
  const auto sums = probabilities.detach().sum(0).to(torch::kFloat64).cpu();
  if (!routed_.tokens_per_expert.defined()) {
    routed_ = {pairs, sums, rows};
    return;
  }
  routed_.tokens_per_expert += pairs;
  routed_.probability_sum += sums;
  routed_.rows += rows;
}

RouterRecord SparseMoeImpl::take_routing() { return std::exchange(routed_, RouterRecord{}); }

double load_balancing_loss(const std::vector<RouterRecord>& records, int64_t num_experts) {
  if (records.empty()) return 0.0;
  auto pairs = torch::zeros({num_experts}, torch::kFloat64), probabilities = pairs.clone();
  double rows = 0;
  for (const auto& r : records) {
    pairs += r.tokens_per_expert;
    probabilities += r.probability_sum;
    rows += static_cast<double>(r.rows);
  }
  if (rows == 0) return 0.0;
  return (pairs / rows * (probabilities / rows)).sum().item<double>() * static_cast<double>(num_experts);
}

std::vector<RouterRecord> take_router_records(torch::nn::Module& module) {
  std::vector<RouterRecord> records;
  for (const auto& m : module.modules(/*include_self=*/true)) {
    if (auto* moe = dynamic_cast<SparseMoeImpl*>(m.get())) {
      auto r = moe->take_routing();
      if (r.tokens_per_expert.defined()) records.push_back(std::move(r));
    }
  }
  return records;
}

}  // namespace tandem::models
