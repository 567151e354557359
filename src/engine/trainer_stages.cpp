// A pipeline's stages gathered onto every rank, for checkpoints and
// exports (Trainer::gather_stages), and, under FSDP x pipeline, the whole
// model's optimizer state that its checkpoints hold
// (Trainer::whole_model_optimizer).
#include "tandem/engine/trainer.h"

#include <functional>
#include <map>
#include <unordered_set>

#include "tandem/optim/state_tensors.h"
#include "tandem/parallel/fsdp_optimizer.h"
#include "tandem/util/check.h"

namespace tandem::engine {

void Trainer::gather_stages(torch::optim::Optimizer* optimizer) {
  if (!mesh_.groups.pipeline) return;
  // Each rank contributes its own pieces' tensors and zeros for the
  // others'; the sum over the ranks is every piece's, on every rank. Two
  // rounds: one all-reduce of which parameters have optimizer state
  // anywhere, then one per dtype of every buffer, parameter and state
  // tensor (SGD's momentum, AdamW's step and moments), flattened.
  std::unordered_set<const void*> foreign;
  for (const auto& piece : others_pieces_) {
    for (const auto& p : piece->parameters()) foreign.insert(p.unsafeGetTensorImpl());
    for (const auto& b : piece->buffers()) foreign.insert(b.unsafeGetTensorImpl());
  }
  auto own = [&](const torch::Tensor& t) { return foreign.count(t.unsafeGetTensorImpl()) == 0; };
  const auto wire = mesh_.groups.pipeline->wire_device();
  torch::NoGradGuard no_grad;
  const auto params = model_->parameters();
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
    mesh_.groups.pipeline->all_reduce(sum).wait();
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
  for (const auto& b : model_->buffers()) items.push_back({b, own(b), in_place(b)});
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
    mesh_.groups.pipeline->all_reduce(flat).wait();
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

// Note [fsdp x pipeline checkpoints]: a checkpoint holds the plain
// optimizer's state over the whole model, whatever the layout, so that any
// other layout resumes it. Under FSDP x pipeline no rank's optimizer is
// that: FsdpSgd or FsdpAdamW steps this rank's shards of its own stage. So
// the state goes through the plain optimizer over model_->parameters(): on
// save, this stage's state gathered over its dp ranks (consolidate_state)
// is put in it, then the other stages' arrive with gather_stages; on
// resume, the checkpoint loads into it and this rank keeps its shards'
// slices (load_full_state). Collectives: every rank calls both.
std::unique_ptr<torch::optim::Optimizer> Trainer::whole_model_optimizer(torch::optim::Optimizer& sharded,
                                                                        bool with_state) {
  std::unique_ptr<torch::optim::Optimizer> whole;
  const auto& options = sharded.param_groups()[0].options();
  if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    whole = std::make_unique<optim::AdamW>(optim::decay_groups(model_->named_parameters(), *adamw), *adamw);
  } else {
    whole = std::make_unique<optim::Sgd>(model_->parameters(),
                                         static_cast<const torch::optim::SGDOptions&>(sharded.defaults()));
    whole->param_groups()[0].set_options(options.clone());
  }
  if (!with_state) return whole;
  auto& state = dynamic_cast<parallel::FsdpState&>(sharded);
  state.consolidate_state();  // over the dp ranks
  const auto& params = plan_->fully_sharded()->model_parameters();
  const auto& full = state.full_state();
  for (size_t i = 0; i < full.size(); ++i) {
    if (full[i].empty()) continue;
    optim::set_parameter_state(*whole, params[i], std::map<std::string, torch::Tensor>(full[i].begin(), full[i].end()));
  }
  return whole;
}

void Trainer::keep_shards_of(const torch::optim::Optimizer& whole, torch::optim::Optimizer& sharded) {
  // The options of the step it was written at; the weight decay stays this
  // run's (Note [fsdp weight decay]: FsdpAdamW's one group holds it).
  auto options = whole.param_groups()[0].options().clone();
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(options.get())) {
    adamw->weight_decay(static_cast<const torch::optim::AdamWOptions&>(sharded.param_groups()[0].options()).weight_decay());
  }
  sharded.param_groups()[0].set_options(std::move(options));
  std::vector<parallel::NamedState> state;
  for (const auto& p : plan_->fully_sharded()->model_parameters()) state.push_back(optim::parameter_state(whole, p));
  dynamic_cast<parallel::FsdpState&>(sharded).load_full_state(state);
}

}  // namespace tandem::engine
