// tandem/parallel/model_parallel.h: a model whose parts live on different
// devices (seed 003: an embedding on the CPU, the rest on a GPU; seed 001's
// ModelParallelResNet50 before it is pipelined).
//
//   auto stages = parallel::split_sequence(model, {1, 3});
//   parallel::ModelParallel mp(stages, {torch::kCPU, {torch::kCUDA, 0}});
//   auto out = mp->forward(x);   // x -> stage 0 on cpu -> moved -> stage 1 on cuda:0
//
// The constructor moves each stage to its device (dtype kept). forward()
// moves the activation to the next stage's device at each boundary, with a
// differentiable copy, so backward carries the gradients back across the
// same boundaries; the output is on the last stage's device. The stages run
// one after another: there is no overlap (that is what Pipeline adds).
#pragma once

#include <vector>

#include <torch/nn/module.h>
#include <torch/types.h>

#include "tandem/models/sequence.h"

namespace tandem::parallel {

class ModelParallelImpl : public torch::nn::Module {
 public:
  // One device per stage; throws tandem::Error when the counts differ.
  ModelParallelImpl(std::vector<models::Sequence> stages, std::vector<torch::Device> devices);

  torch::Tensor forward(torch::Tensor x);

  const std::vector<models::Sequence>& stages() const { return stages_; }
  const std::vector<torch::Device>& devices() const { return devices_; }

 private:
  std::vector<models::Sequence> stages_;
  std::vector<torch::Device> devices_;
};
TORCH_MODULE(ModelParallel);

}  // namespace tandem::parallel
