// tandem/models/resnet.h: ResNet-18/34/50 with torchvision's layout.
//
// Parameter names and counts equal torchvision.models.resnet*'s (resnet18 with
// 1000 classes: 11,689,512 parameters), so exported weights load there.
// The model is a Sequence: conv1, bn1, relu, [maxpool], layer1..4,
// avgpool, flatten, fc.
#pragma once

#include <torch/nn.h>

#include "tandem/models/options.h"
#include "tandem/models/sequence.h"

namespace tandem::models {

// Two 3x3 convolutions (ResNet-18/34).
class BasicBlockImpl : public torch::nn::Cloneable<BasicBlockImpl> {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, NormFactory norm = {});
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t in_planes_, planes_, stride_;
  NormFactory norm_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::AnyModule bn1, bn2;
  Sequence downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

// 1x1, 3x3 (with the stride, as torchvision's "v1.5"), 1x1 x4 (ResNet-50).
class BottleneckImpl : public torch::nn::Cloneable<BottleneckImpl> {
 public:
  static constexpr int64_t kExpansion = 4;
  BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride, NormFactory norm = {});
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t in_planes_, planes_, stride_;
  NormFactory norm_;
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr}, conv3{nullptr};
  torch::nn::AnyModule bn1, bn2, bn3;
  Sequence downsample{nullptr};
};
TORCH_MODULE(Bottleneck);

Sequence resnet18(const ModelOptions& options);
Sequence resnet34(const ModelOptions& options);
Sequence resnet50(const ModelOptions& options);

}  // namespace tandem::models
