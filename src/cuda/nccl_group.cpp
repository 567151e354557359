// NCCL process groups, made in the CUDA module.
//
// Note [nccl headers]: c10d's ProcessGroupNCCL.hpp needs nccl.h and the CUDA
// runtime headers (the CUDA toolkit's include folder, which torch's CMake
// config adds when it finds a toolkit). ProcessGroupNCCL itself is compiled
// into the wheel's libtorch_cuda. Without those headers the module makes no
// NCCL groups (Parts::nccl is false) and --dist-backend nccl is refused
// with a message saying so.
#include "module.h"

#if defined(USE_C10D_NCCL) && __has_include(<nccl.h>) && __has_include(<cuda_runtime_api.h>)
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#define TANDEM_WITH_NCCL 1
#else
#include <torch/csrc/distributed/c10d/Backend.hpp>
#define TANDEM_WITH_NCCL 0
#endif

#include "tandem/util/check.h"

namespace tandem::cuda {

const bool kNcclBuilt = TANDEM_WITH_NCCL;

c10::intrusive_ptr<c10d::Backend> nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             std::chrono::milliseconds timeout) {
#if TANDEM_WITH_NCCL
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  TANDEM_FAIL("this CUDA module was compiled without nccl.h (see docs/BUILD.md)");
#endif
}

}  // namespace tandem::cuda
