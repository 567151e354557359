// tandem/models/mobilenetv2.h: MobileNetV2 with torchvision's layout.
//
// Names and parameter counts equal torchvision.models.mobilenet_v2's (3,504,872
// with 1000 classes at width 1.0). A Sequence: features, avgpool, flatten,
// classifier (Dropout(0.2), Linear).
#pragma once

#include <torch/nn.h>

#include "tandem/models/options.h"
#include "tandem/models/sequence.h"

namespace tandem::models {

// Expand (1x1) - depthwise (3x3) - project (1x1, linear), with a residual
// connection when the shape is kept.
class InvertedResidualImpl : public torch::nn::Cloneable<InvertedResidualImpl> {
 public:
  InvertedResidualImpl(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio,
                       NormFactory norm = {});
  void reset() override;
  torch::Tensor forward(torch::Tensor x);

 private:
  int64_t in_, out_, stride_, expand_ratio_;
  NormFactory norm_;
  Sequence conv{nullptr};
};
TORCH_MODULE(InvertedResidual);

// torchvision's _make_divisible: round to a multiple of `divisor`, never
// dropping more than 10%.
int64_t make_divisible(double value, int64_t divisor = 8);

Sequence mobilenetv2(const ModelOptions& options);

}  // namespace tandem::models
