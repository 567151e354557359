// tandem/models/convnet.h: the small models.
//
// convnet: a small, fast convolutional classifier.
// Two conv(3x3)-BatchNorm-ReLU-maxpool blocks (32, 64 channels) and a
// 128-unit hidden layer. No dropout, so a run is a deterministic function of
// its seed. About 0.4M parameters at 28x28; >92% on Fashion-MNIST in a few
// epochs on a CPU.
#pragma once

#include "tandem/models/options.h"
#include "tandem/models/sequence.h"

namespace tandem::models {

Sequence convnet(const ModelOptions& options);

// mlp: flatten, then Linear(C*H*W, 256), ReLU, Linear(256, 128), ReLU,
// Linear(128, classes). No BatchNorm, no pooling: a smooth function of its
// weights, for exact comparisons between parallel strategies (about 235k
// parameters at 28x28; ~88% on Fashion-MNIST).
Sequence mlp(const ModelOptions& options);

}  // namespace tandem::models
