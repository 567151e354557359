#include "tandem/models/convnet.h"

#include "tandem/util/check.h"

namespace tandem::models {

Sequence convnet(const ModelOptions& o) {
  namespace nn = torch::nn;
  TANDEM_CHECK(o.image_size >= 4, "convnet: image size must be at least 4, got ", o.image_size);
  int64_t side = o.image_size / 4;  // after two 2x2 max pools
  Sequence net;
  net->push_back("conv1", nn::Conv2d(nn::Conv2dOptions(o.in_channels, 32, 3).padding(1).bias(false)));
  net->push_back_any("bn1", make_norm(o.norm_layer, 32));
  net->push_back("relu1", nn::ReLU());
  net->push_back("pool1", nn::MaxPool2d(2));
  net->push_back("conv2", nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1).bias(false)));
  net->push_back_any("bn2", make_norm(o.norm_layer, 64));
  net->push_back("relu2", nn::ReLU());
  net->push_back("pool2", nn::MaxPool2d(2));
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc1", nn::Linear(64 * side * side, 128));
  net->push_back("relu3", nn::ReLU());
  net->push_back("fc2", nn::Linear(128, o.num_classes));
  return net;
}

Sequence mlp(const ModelOptions& o) {
  namespace nn = torch::nn;
  TANDEM_CHECK(o.image_size >= 1, "mlp: image size must be positive, got ", o.image_size);
  Sequence net;
  net->push_back("flatten", nn::Flatten());
  net->push_back("fc1", nn::Linear(o.in_channels * o.image_size * o.image_size, 256));
  net->push_back("relu1", nn::ReLU());
  net->push_back("fc2", nn::Linear(256, 128));
  net->push_back("relu2", nn::ReLU());
  net->push_back("fc3", nn::Linear(128, o.num_classes));
  return net;
}

}  // namespace tandem::models
