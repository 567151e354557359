#include "tandem/models/resnet.h"

#include "tandem/models/sequence.h"
#include "tandem/util/check.h"

namespace tandem::models {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::Conv2d(
      nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

// 1x1 convolution + BatchNorm on the shortcut when the shape changes.
Sequence make_downsample(int64_t in, int64_t out, int64_t stride, const NormFactory& norm) {
  if (stride == 1 && in == out) return nullptr;
  Sequence shortcut;
  shortcut->push_back(conv(in, out, 1, stride, 0));
  shortcut->push_back_any("", make_norm(norm, out));
  return shortcut;
}

// torchvision's initialisation: He (fan_out) for convolutions, BatchNorm at
// weight 1 and bias 0; Linear keeps libtorch's default, as torchvision does.
void init_weights(nn::Module& model) {
  for (auto& module : model.modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(bn->weight);
      nn::init::zeros_(bn->bias);
    }
  }
}

template <typename Block>
Sequence make_stage(int64_t& in_planes, int64_t planes, int64_t blocks, int64_t stride,
                    const NormFactory& norm) {
  Sequence stage;
  stage->push_back(Block(in_planes, planes, stride, norm));
  in_planes = planes * Block::Impl::kExpansion;
  for (int64_t i = 1; i < blocks; ++i) stage->push_back(Block(in_planes, planes, 1, norm));
  return stage;
}

template <typename Block>
Sequence make_resnet(const ModelOptions& o, std::array<int64_t, 4> blocks) {
  const bool cifar = resolved_stem(o) == "cifar";
  Sequence net;
  if (cifar) {
    net->push_back("conv1", conv(o.in_channels, 64, 3, 1, 1));
  } else {
    net->push_back("conv1", conv(o.in_channels, 64, 7, 2, 3));
  }
  net->push_back_any("bn1", make_norm(o.norm_layer, 64));
  net->push_back("relu", nn::ReLU(nn::ReLUOptions(/*inplace=*/true)));
  if (!cifar) {
    net->push_back("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  }
  int64_t in_planes = 64;
  net->push_back("layer1", make_stage<Block>(in_planes, 64, blocks[0], 1, o.norm_layer));
  net->push_back("layer2", make_stage<Block>(in_planes, 128, blocks[1], 2, o.norm_layer));
  net->push_back("layer3", make_stage<Block>(in_planes, 256, blocks[2], 2, o.norm_layer));
  net->push_back("layer4", make_stage<Block>(in_planes, 512, blocks[3], 2, o.norm_layer));
  net->push_back("avgpool", nn::AdaptiveAvgPool2d(1));
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc", nn::Linear(in_planes, o.num_classes));
  init_weights(*net);
  return net;
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride, NormFactory norm)
    : in_planes_(in_planes), planes_(planes), stride_(stride), norm_(std::move(norm)) {
  reset();
}

void BasicBlockImpl::reset() {
  conv1 = register_module("conv1", conv(in_planes_, planes_, 3, stride_, 1));
  bn1 = make_norm(norm_, planes_);
  register_module("bn1", bn1.ptr());
  conv2 = register_module("conv2", conv(planes_, planes_, 3, 1, 1));
  bn2 = make_norm(norm_, planes_);
  register_module("bn2", bn2.ptr());
  downsample = make_downsample(in_planes_, planes_ * kExpansion, stride_, norm_);
  if (downsample) register_module("downsample", downsample);
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  auto out = torch::relu(bn1.forward(conv1(x)));
  out = bn2.forward(conv2(out));
  auto shortcut = downsample ? downsample->forward(x) : x;
  return torch::relu(out + shortcut);
}

BottleneckImpl::BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride, NormFactory norm)
    : in_planes_(in_planes), planes_(planes), stride_(stride), norm_(std::move(norm)) {
  reset();
}

void BottleneckImpl::reset() {
  conv1 = register_module("conv1", conv(in_planes_, planes_, 1, 1, 0));
  bn1 = make_norm(norm_, planes_);
  register_module("bn1", bn1.ptr());
  conv2 = register_module("conv2", conv(planes_, planes_, 3, stride_, 1));
  bn2 = make_norm(norm_, planes_);
  register_module("bn2", bn2.ptr());
  conv3 = register_module("conv3", conv(planes_, planes_ * kExpansion, 1, 1, 0));
  bn3 = make_norm(norm_, planes_ * kExpansion);
  register_module("bn3", bn3.ptr());
  downsample = make_downsample(in_planes_, planes_ * kExpansion, stride_, norm_);
  if (downsample) register_module("downsample", downsample);
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  auto out = torch::relu(bn1.forward(conv1(x)));
  out = torch::relu(bn2.forward(conv2(out)));
  out = bn3.forward(conv3(out));
  auto shortcut = downsample ? downsample->forward(x) : x;
  return torch::relu(out + shortcut);
}

Sequence resnet18(const ModelOptions& o) { return make_resnet<BasicBlock>(o, {2, 2, 2, 2}); }
Sequence resnet34(const ModelOptions& o) { return make_resnet<BasicBlock>(o, {3, 4, 6, 3}); }
Sequence resnet50(const ModelOptions& o) { return make_resnet<Bottleneck>(o, {3, 4, 6, 3}); }

}  // namespace tandem::models
