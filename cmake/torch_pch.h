// The one precompiled header: libtorch's C++ frontend (see
// cmake/TandemTargets.cmake). Nothing of tandem's own goes here.
#pragma once
#include <torch/torch.h>
