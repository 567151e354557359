#include "tandem/models/mobilenetv2.h"

#include <algorithm>
#include <cmath>

#include "tandem/util/check.h"

namespace tandem::models {
namespace {

namespace nn = torch::nn;

// Conv2d - BatchNorm2d - ReLU6, torchvision's Conv2dNormActivation.
Sequence conv_bn_relu6(int64_t in, int64_t out, int64_t kernel, int64_t stride,
                       const NormFactory& norm, int64_t groups = 1) {
  Sequence block;
  block->push_back(nn::Conv2d(nn::Conv2dOptions(in, out, kernel)
                                  .stride(stride)
                                  .padding((kernel - 1) / 2)
                                  .groups(groups)
                                  .bias(false)));
  block->push_back_any("", make_norm(norm, out));
  block->push_back(nn::ReLU6(nn::ReLU6Options(/*inplace=*/true)));
  return block;
}

}  // namespace

int64_t make_divisible(double value, int64_t divisor) {
  int64_t rounded = std::max<int64_t>(
      divisor, static_cast<int64_t>(value + divisor / 2.0) / divisor * divisor);
  if (rounded < 0.9 * value) rounded += divisor;
  return rounded;
}

InvertedResidualImpl::InvertedResidualImpl(int64_t in, int64_t out, int64_t stride,
                                           int64_t expand_ratio, NormFactory norm)
    : in_(in), out_(out), stride_(stride), expand_ratio_(expand_ratio), norm_(std::move(norm)) {
  reset();
}

void InvertedResidualImpl::reset() {
  int64_t hidden = in_ * expand_ratio_;
  conv = Sequence();
  if (expand_ratio_ != 1) conv->push_back(conv_bn_relu6(in_, hidden, 1, 1, norm_));
  conv->push_back(conv_bn_relu6(hidden, hidden, 3, stride_, norm_, /*groups=*/hidden));
  conv->push_back(nn::Conv2d(nn::Conv2dOptions(hidden, out_, 1).bias(false)));
  conv->push_back_any("", make_norm(norm_, out_));
  register_module("conv", conv);
}

torch::Tensor InvertedResidualImpl::forward(torch::Tensor x) {
  if (stride_ == 1 && in_ == out_) return x + conv->forward(x);
  return conv->forward(x);
}

Sequence mobilenetv2(const ModelOptions& o) {
  TANDEM_CHECK(o.width_mult > 0 && o.width_mult <= kMaxWidthMult, "mobilenetv2 width multiplier: expected > 0 and <= ",
               kMaxWidthMult, ", got ", o.width_mult);
  // t (expansion), c (channels), n (repeats), s (first stride)
  const int64_t settings[7][4] = {{1, 16, 1, 1},  {6, 24, 2, 2},  {6, 32, 3, 2},
                                  {6, 64, 4, 2},  {6, 96, 3, 1},  {6, 160, 3, 2},
                                  {6, 320, 1, 1}};
  int64_t channels = make_divisible(32 * o.width_mult);
  int64_t last = make_divisible(1280 * std::max(1.0, o.width_mult));
  Sequence features;
  features->push_back(conv_bn_relu6(o.in_channels, channels, 3, 2, o.norm_layer));
  for (const auto& s : settings) {
    int64_t out = make_divisible(s[1] * o.width_mult);
    for (int64_t i = 0; i < s[2]; ++i) {
      features->push_back(InvertedResidual(channels, out, i == 0 ? s[3] : 1, s[0], o.norm_layer));
      channels = out;
    }
  }
  features->push_back(conv_bn_relu6(channels, last, 1, 1, o.norm_layer));

  Sequence classifier;
  classifier->push_back(nn::Dropout(0.2));
  classifier->push_back(nn::Linear(last, o.num_classes));

  Sequence net;
  net->push_back("features", features);
  net->push_back("avgpool", nn::AdaptiveAvgPool2d(1));
  net->push_back("flatten", nn::Flatten());
  net->push_back("classifier", classifier);

  // torchvision's initialisation.
  for (auto& module : net->modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut);
    } else if (auto* bn = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    } else if (auto* fc = module->as<nn::Linear>()) {
      nn::init::normal_(fc->weight, 0.0, 0.01);
      nn::init::zeros_(fc->bias);
    }
  }
  return net;
}

}  // namespace tandem::models
