#include "tandem/dist/collectives.h"

#include <torch/torch.h>

namespace tandem::dist {

void average_gradients(torch::nn::Module& module, ProcessGroup& group) {
  std::vector<Work> pending;
  for (auto& parameter : module.parameters()) {
    auto grad = parameter.mutable_grad();
    if (!grad.defined()) continue;
    pending.push_back(group.all_reduce(grad, ReduceOp::kAvg));
  }
  for (auto& work : pending) work.wait();
}

void broadcast_module(torch::nn::Module& module, ProcessGroup& group, int64_t root) {
  torch::NoGradGuard no_grad;
  std::vector<Work> pending;
  for (auto& parameter : module.parameters()) pending.push_back(group.broadcast(parameter, root));
  for (auto& buffer : module.buffers()) pending.push_back(group.broadcast(buffer, root));
  for (auto& work : pending) work.wait();
}

void broadcast_buffers(torch::nn::Module& module, ProcessGroup& group, int64_t root) {
  torch::NoGradGuard no_grad;
  std::vector<Work> pending;
  for (auto& buffer : module.buffers()) pending.push_back(group.broadcast(buffer, root));
  for (auto& work : pending) work.wait();
}

}  // namespace tandem::dist
