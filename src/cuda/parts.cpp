// The CUDA module's entry points (tandem/cuda/parts.h): the only symbols it
// exports (it is compiled with hidden visibility).
#include "module.h"

int tandem_cuda_parts_version() { return tandem::cuda::kPartsVersion; }

const tandem::cuda::Parts* tandem_cuda_parts() {
  static const tandem::cuda::Parts parts = [] {
    tandem::cuda::Parts p;
    p.nccl = tandem::cuda::kNcclBuilt;
    p.nccl_group = &tandem::cuda::nccl_group;
    p.graph_step = &tandem::cuda::graph_step;
    p.device_name = &tandem::cuda::device_name;
    return p;
  }();
  return &parts;
}
