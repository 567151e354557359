// Optimizer state as named tensors (state_tensors.h).
#include "tandem/optim/state_tensors.h"

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "tandem/util/check.h"

namespace tandem::optim {
namespace {

bool is_adamw(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::AdamWOptions*>(&optimizer.defaults()) != nullptr;
}

bool is_sgd(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const torch::optim::SGDOptions*>(&optimizer.defaults()) != nullptr;
}

bool amsgrad(const torch::optim::Optimizer& optimizer) {
  return static_cast<const torch::optim::AdamWOptions&>(optimizer.defaults()).amsgrad();
}

}  // namespace

std::vector<StateSlot> state_slots(const torch::optim::Optimizer& optimizer, const torch::Tensor& p) {
  return state_slots(optimizer, p, p.sizes());
}

std::vector<StateSlot> state_slots(const torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                                   c10::IntArrayRef sizes) {
  const auto shape = sizes.vec();
  if (is_sgd(optimizer)) return {{"momentum_buffer", shape, p.scalar_type()}};
  TANDEM_CHECK(is_adamw(optimizer), "optimizer state: only SGD's and AdamW's are known");
  std::vector<StateSlot> slots{{"step", {}, torch::kInt64},
                               {"exp_avg", shape, p.scalar_type()},
                               {"exp_avg_sq", shape, p.scalar_type()}};
  if (amsgrad(optimizer)) slots.push_back({"max_exp_avg_sq", shape, p.scalar_type()});
  return slots;
}

std::vector<std::pair<std::string, torch::Tensor>> parameter_state(const torch::optim::Optimizer& optimizer,
                                                                   const torch::Tensor& p) {
  auto found = optimizer.state().find(p.unsafeGetTensorImpl());
  if (found == optimizer.state().end()) return {};
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDParamState*>(found->second.get())) {
    if (!sgd->momentum_buffer().defined()) return {};
    return {{"momentum_buffer", sgd->momentum_buffer()}};
  }
  const auto* adamw = dynamic_cast<const torch::optim::AdamWParamState*>(found->second.get());
  TANDEM_CHECK(adamw != nullptr, "optimizer state: only SGD's and AdamW's are known");
  std::vector<std::pair<std::string, torch::Tensor>> named{{"step", torch::tensor(adamw->step(), torch::kInt64)},
                                                           {"exp_avg", adamw->exp_avg()},
                                                           {"exp_avg_sq", adamw->exp_avg_sq()}};
  if (adamw->max_exp_avg_sq().defined()) named.emplace_back("max_exp_avg_sq", adamw->max_exp_avg_sq());
  return named;
}

void set_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                         const std::map<std::string, torch::Tensor>& named) {
  set_parameter_state(optimizer, p, named, p.sizes());
}

void set_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p,
                         const std::map<std::string, torch::Tensor>& named, c10::IntArrayRef shape) {
  auto get = [&](const StateSlot& slot) {
    auto it = named.find(slot.name);
    TANDEM_CHECK(it != named.end(), "optimizer state: no ", slot.name, " for a parameter of ", shape);
    TANDEM_CHECK(it->second.sizes().vec() == slot.shape, "optimizer state: a ", slot.name, " of ",
                 it->second.sizes(), " for a parameter of ", shape);
    return it->second;
  };
  const auto slots = state_slots(optimizer, p, shape);
  auto* key = p.unsafeGetTensorImpl();
  if (is_sgd(optimizer)) {
    auto state = std::make_unique<torch::optim::SGDParamState>();
    state->momentum_buffer(get(slots[0]).to(p.device(), p.scalar_type()).clone());
    optimizer.state()[key] = std::move(state);
    return;
  }
  auto state = std::make_unique<torch::optim::AdamWParamState>();
  state->step(get(slots[0]).item<int64_t>());
  state->exp_avg(get(slots[1]).to(p.device(), p.scalar_type()).clone());
  state->exp_avg_sq(get(slots[2]).to(p.device(), p.scalar_type()).clone());
  if (slots.size() > 3) state->max_exp_avg_sq(get(slots[3]).to(p.device(), p.scalar_type()).clone());
  optimizer.state()[key] = std::move(state);
}

void map_parameter_state(torch::optim::Optimizer& optimizer, const torch::Tensor& p, c10::IntArrayRef shape,
                         const std::function<torch::Tensor(const torch::Tensor&)>& map) {
  auto state = parameter_state(optimizer, p);
  if (state.empty()) return;
  std::map<std::string, torch::Tensor> mapped;
  for (const auto& [name, t] : state) mapped[name] = t.sizes() == shape ? map(t) : t;
  set_parameter_state(optimizer, p, mapped);
}

}  // namespace tandem::optim
