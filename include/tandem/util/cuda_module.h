// tandem/util/cuda_module.h: tandem's CUDA half, a module loaded where a
// CUDA driver is.
//
//   int main(int argc, char** argv) {
//     tandem::cuda::load_when_present();  // before anything asks for CUDA
//     ...
//   }
//
// Note [CUDA as a module]: tandem's own programs (the CLI, the tests, the
// benchmarks) link libtorch's CPU half only. Its CUDA half (libtorch_cuda
// and the CUDA libraries it needs: cuBLAS, cuDNN, NCCL, ...) registers its
// kernels and CUDA hooks when it is loaded, which took 0.3 s of every
// process start on a machine without a GPU, a third of `tandem --version`.
// So the three parts of tandem that call CUDA directly (NCCL groups, CUDA
// graphs, a device's name for its peak) are the module libtandem_cuda.so,
// and loading it loads libtorch_cuda: load_when_present() does so when the
// CUDA driver library can be opened, once, and must run before the first
// torch::cuda::is_available() (which is false until then). Programs that
// link the whole of libtorch themselves (an install's users) have CUDA
// already; the module is then loaded at the first use of one of its parts.
#pragma once

#include <string>

namespace tandem::cuda {

// Loads the module when libcuda.so.1 (the driver) can be opened; returns
// whether it is loaded. Tries once; thread-safe.
bool load_when_present();

// Loads the module whether or not a driver is present (a test's way to
// check the module on a machine without a GPU); false when it cannot be
// loaded, with the reason in load_error().
bool load();

// Whether the module is loaded in this process.
bool loaded();

// Why the module could not be loaded ("" when it is loaded, was not tried,
// or there is no driver to use it with): no CUDA half in this build, or the
// module's dlopen error naming the file. Messages that say CUDA is not
// available add it.
std::string load_error();

// The module's parts (tandem/cuda/parts.h), after load_when_present();
// null when the module is not loaded.
struct Parts;
const Parts* parts();

// The version of tandem/cuda/parts.h's struct: the loader refuses a module
// of another (a stale install), rather than call it.
constexpr int kPartsVersion = 1;

}  // namespace tandem::cuda
