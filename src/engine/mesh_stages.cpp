// A pipeline over ranks in the mesh plan (mesh_plan.h): every stage's
// weights and optimizer state gathered onto every rank, for checkpoints and
// exports, and the other stages' state dropped again.
#include <functional>
#include <map>
#include <unordered_set>

#include "tandem/engine/mesh_plan.h"
#include "tandem/optim/state_tensors.h"
#include "tandem/util/check.h"

namespace tandem::engine {

void MeshPlan::gather_stages(torch::nn::Module& model, torch::optim::Optimizer* optimizer) {
  if (!groups.pipeline) return;
  // Each rank contributes its own pieces' tensors and zeros for the
  // others'; the sum over the ranks is every piece's, on every rank. Two
  // rounds: one all-reduce of which parameters have optimizer state
  // anywhere, then one per dtype of every buffer, parameter and state
  // tensor (SGD's momentum, AdamW's step and moments), flattened.
  std::unordered_set<const void*> foreign;
  for (const auto& piece : others_pieces) {
    for (const auto& p : piece->parameters()) foreign.insert(p.unsafeGetTensorImpl());
    for (const auto& b : piece->buffers()) foreign.insert(b.unsafeGetTensorImpl());
  }
  auto own = [&](const torch::Tensor& t) { return foreign.count(t.unsafeGetTensorImpl()) == 0; };
  const auto wire = groups.pipeline->wire_device();
  torch::NoGradGuard no_grad;
  const auto params = model.parameters();
  // Whether any rank has optimizer state for a parameter: the same steps
  // ran on the same parameters everywhere, but only its owner holds it.
  auto has = torch::zeros({static_cast<int64_t>(params.size())}, torch::kFloat64);
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> state(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (!own(params[i])) continue;
    if (optimizer) state[i] = optim::parameter_state(*optimizer, params[i]);
    if (!state[i].empty()) has[static_cast<int64_t>(i)] = 1.0;
  }
  {
    auto sum = has.to(wire);
    groups.pipeline->all_reduce(sum).wait();
    has = sum.cpu();
  }
  // What to gather: the tensor, whether this rank holds it, and where the
  // sum goes (a state that this rank lacks is made from its slots, after
  // the sums: optim/state_tensors.h).
  struct Item {
    torch::Tensor tensor;
    bool own;
    std::function<void(const torch::Tensor&)> store;
  };
  std::vector<Item> items;
  auto in_place = [](torch::Tensor t) { return [t](const torch::Tensor& sum) mutable { t.copy_(sum); }; };
  std::vector<std::map<std::string, torch::Tensor>> made(params.size());
  for (const auto& b : model.buffers()) items.push_back({b, own(b), in_place(b)});
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    items.push_back({p, own(p), in_place(p)});
    if (has[static_cast<int64_t>(i)].item<double>() == 0) continue;
    if (!state[i].empty()) {
      // A 0-dim step is stored back through the state; tensors in place.
      for (auto& [name, t] : state[i]) {
        if (t.dim() == 0) {
          items.push_back({t, true, [&made, i, name = name](const torch::Tensor& sum) { made[i][name] = sum.clone(); }});
        } else {
          items.push_back({t, true, in_place(t)});
        }
      }
    } else {
      for (const auto& slot : optim::state_slots(*optimizer, p)) {
        auto stand_in = torch::zeros(slot.shape, torch::TensorOptions().dtype(slot.dtype));
        items.push_back({stand_in, false, [&made, i, name = slot.name](const torch::Tensor& sum) {
                           made[i][name] = sum.clone();
                         }});
      }
    }
  }
  std::map<torch::ScalarType, std::vector<const Item*>> by_dtype;
  for (const auto& item : items) by_dtype[item.tensor.scalar_type()].push_back(&item);
  for (const auto& [dtype, group] : by_dtype) {
    std::vector<torch::Tensor> parts;
    for (const auto* item : group) {
      const auto& t = item->tensor;
      parts.push_back(item->own ? t.detach().reshape({-1}).to(wire)
                                : torch::zeros({t.numel()}, t.options().device(wire)));
    }
    auto flat = torch::cat(parts);
    groups.pipeline->all_reduce(flat).wait();
    int64_t offset = 0;
    for (const auto* item : group) {
      const auto& t = item->tensor;
      item->store(flat.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  // The states this rank lacked, or whose step it had as a number.
  for (size_t i = 0; i < params.size(); ++i) {
    if (made[i].empty()) continue;
    for (const auto& [name, t] : state[i]) made[i].emplace(name, t);  // its own moments, already summed in place
    optim::set_parameter_state(*optimizer, params[i], made[i]);
  }
}

std::vector<torch::Tensor> MeshPlan::stepped_elsewhere() const {
  std::vector<torch::Tensor> elsewhere;
  for (const auto& piece : others_pieces) {
    for (const auto& p : piece->parameters()) {
      if (!borrows(p)) elsewhere.push_back(p);  // Note [tied weights across stages]: the copy is stepped here
    }
  }
  return elsewhere;
}

void MeshPlan::sum_over_stages(std::vector<double>& values) const {
  if (!groups.pipeline) return;
  auto sum = torch::tensor(values, torch::kFloat64).to(groups.pipeline->wire_device());
  groups.pipeline->all_reduce(sum).wait();
  sum = sum.cpu();
  values.assign(sum.data_ptr<double>(), sum.data_ptr<double>() + sum.numel());
}

void MeshPlan::drop_others_state(torch::optim::Optimizer& optimizer) const {
  for (const auto& piece : others_pieces) {
    for (const auto& p : piece->parameters()) {
      if (!borrows(p)) optimizer.state().erase(p.unsafeGetTensorImpl());  // Note [tied weights across stages]
    }
  }
}

std::vector<const torch::nn::Module*> MeshPlan::modules_here(const torch::nn::Module& model) const {
  std::vector<const torch::nn::Module*> mine;
  if (!groups.pipeline) return {&model};
  for (const auto& piece : own_pieces) mine.push_back(piece.get());
  return mine;
}

}  // namespace tandem::engine
