#include "tandem/parallel/model_parallel.h"

#include <c10/core/DeviceGuard.h>

#include "tandem/util/check.h"

namespace tandem::parallel {

ModelParallelImpl::ModelParallelImpl(std::vector<models::Sequence> stages,
                                     std::vector<torch::Device> devices)
    : stages_(std::move(stages)), devices_(std::move(devices)) {
  TANDEM_CHECK(!stages_.empty(), "model parallel: no stages");
  TANDEM_CHECK(stages_.size() == devices_.size(), "model parallel: ", stages_.size(),
               " stages but ", devices_.size(), " devices; give one device per stage");
  for (size_t s = 0; s < stages_.size(); ++s) {
    stages_[s]->to(devices_[s]);
    register_module("stage" + std::to_string(s), stages_[s]);
  }
}

torch::Tensor ModelParallelImpl::forward(torch::Tensor x) {
  for (size_t s = 0; s < stages_.size(); ++s) {
    c10::OptionalDeviceGuard guard;
    if (devices_[s].is_cuda()) guard.reset_device(devices_[s]);
    x = stages_[s]->forward(x.to(devices_[s]));  // the boundary: a differentiable copy
  }
  return x;
}

}  // namespace tandem::parallel
