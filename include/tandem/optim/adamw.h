// tandem/optim/adamw.h: AdamW with PyTorch's arithmetic, stepped with
// foreach kernels or PyTorch's fused kernel.
//
//   auto options = torch::optim::AdamWOptions(6e-4).betas({0.9, 0.95}).weight_decay(0.1);
//   optim::AdamW optimizer(optim::decay_groups(model->named_parameters(), options), options);
//
// A drop-in torch::optim::AdamW: the same options, the same state under the
// same keys (step, exp_avg, exp_avg_sq, max_exp_avg_sq), so checkpoints of
// either load into the other. The update is torch.optim.AdamW's (Python),
// which libtorch's C++ AdamW does not reproduce bit for bit (it decays
// exp_avg with mul and add where Python lerps):
//   p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   (amsgrad: v_max = max(v_max, v), used in v's place below)
//   p += -(lr / (1 - beta1^t)) * m / (sqrt(v) / (1 - beta2^t)^0.5 + eps)
// Two kernels, as PyTorch's foreach= and fused= flags choose:
//  - foreach: each line one _foreach kernel per (device, dtype) group of
//    parameters; on the CPU the foreach ops run per tensor, so the weights
//    and state are bit-identical to torch.optim.AdamW's default (and
//    foreach=True) there (tests/optim/adamw_test.cpp);
//  - fused: at::_fused_adamw_, one kernel per group for the whole update
//    (PyTorch's fused=True; bit-identical to it, on the CPU as on CUDA).
// AdamWKernel::automatic picks fused for CUDA parameters (one launch per
// group instead of about ten) and foreach for the others; PyTorch itself
// defaults to foreach everywhere.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include <torch/optim/adamw.h>
#include <torch/ordered_dict.h>

namespace tandem::optim {

enum class AdamWKernel { automatic, foreach, fused };

class AdamW : public torch::optim::AdamW {
 public:
  AdamW(std::vector<torch::optim::OptimizerParamGroup> groups, torch::optim::AdamWOptions defaults,
        AdamWKernel kernel = AdamWKernel::automatic);
  AdamW(std::vector<torch::Tensor> params, torch::optim::AdamWOptions defaults,
        AdamWKernel kernel = AdamWKernel::automatic);

  torch::Tensor step(LossClosure closure = nullptr) override;

  AdamWKernel kernel() const { return kernel_; }

 protected:
  // Whether step() updates `p` (a sharded optimizer steps only its rank's share).
  virtual bool steps_parameter(const torch::Tensor& /*p*/) const { return true; }

 private:
  AdamWKernel kernel_;
  // The fused kernel reads each parameter's step from a float32 tensor on
  // its device (PyTorch's state["step"]); kept here beside the integer step
  // of the state, and remade when a loaded state's step differs.
  struct StepTensor {
    int64_t step = -1;
    torch::Tensor tensor;
  };
  std::unordered_map<const c10::TensorImpl*, StepTensor> step_tensors_;
};

// nanoGPT's and llm.c's two groups, both with `options`: the parameters of
// two or more dimensions (matrices, embeddings) decayed by its weight decay,
// the others (biases, norms' gains) not decayed. A group that would be
// empty is left out; each keeps the parameters' order. Parameters that
// need no gradient are left out.
std::vector<torch::optim::OptimizerParamGroup> decay_groups(
    const torch::OrderedDict<std::string, torch::Tensor>& named_parameters, const torch::optim::AdamWOptions& options);
// The same over `params` of the given shapes (FSDP's parameters hold no
// elements at rest), all of them.
std::vector<torch::optim::OptimizerParamGroup> decay_groups(const std::vector<torch::Tensor>& params,
                                                            const std::vector<std::vector<int64_t>>& shapes,
                                                            const torch::optim::AdamWOptions& options);

}  // namespace tandem::optim
