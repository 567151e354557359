// The CUDA module (Note [CUDA as a module] in tandem/util/cuda_module.h):
// loaded only where a driver is, and then libtorch's CUDA half with it.
#include <dlfcn.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <torch/cuda.h>

#include "tandem/cuda/parts.h"
#include "tandem/util/cuda_module.h"

namespace {

bool mapped(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/" + library) != std::string::npos) return true;
  }
  return false;
}

// Whether aten::add has a CUDA kernel: libtorch_cuda registers them.
bool cuda_kernels_registered() {
  return c10::Dispatcher::singleton().findSchemaOrThrow("aten::add", "Tensor").hasKernelForDispatchKey(
      c10::DispatchKey::CUDA);
}

bool driver_present() { return ::dlopen("libcuda.so.1", RTLD_LAZY) != nullptr; }

}  // namespace

// The test's main ran load_when_present() (tests/testing/test_main.cpp), as
// the CLI's does: without a driver nothing of CUDA is in the process; the
// module loaded by force brings libtorch's CUDA half, kernels and all.
TEST(CudaModuleTest, TheCudaHalfComesOnlyWithADriverOrWhenAskedFor) {
  if (driver_present()) {
    EXPECT_TRUE(tandem::cuda::loaded()) << tandem::cuda::load_error();
    EXPECT_TRUE(mapped("libtorch_cuda.so"));
    EXPECT_TRUE(cuda_kernels_registered());
  } else {
    EXPECT_FALSE(tandem::cuda::loaded());
    EXPECT_EQ(tandem::cuda::load_error(), "");  // no driver is no error
    EXPECT_FALSE(mapped("libtorch_cuda.so"));
    EXPECT_FALSE(cuda_kernels_registered());
    EXPECT_EQ(tandem::cuda::parts(), nullptr);
  }
  if (!tandem::cuda::load() && tandem::cuda::load_error().find("without CUDA") != std::string::npos) {
    GTEST_SKIP() << tandem::cuda::load_error();
  }
  ASSERT_TRUE(tandem::cuda::loaded()) << tandem::cuda::load_error();
  EXPECT_TRUE(mapped("libtorch_cuda.so"));
  EXPECT_TRUE(cuda_kernels_registered());
  const auto* parts = tandem::cuda::parts();
  ASSERT_NE(parts, nullptr);
  EXPECT_NE(parts->nccl_group, nullptr);
  EXPECT_NE(parts->graph_step, nullptr);
  EXPECT_NE(parts->device_name, nullptr);
  if (!driver_present()) {
    EXPECT_FALSE(torch::cuda::is_available());
    EXPECT_ANY_THROW(parts->device_name(0));  // the module's code runs, and CUDA says why not
  }
}

// A module that is not one, or not this tandem's, is refused naming the
// file, and loading stays possible.
TEST(CudaModuleFileTest, AFileThatIsNotTheModuleIsNamed) {
  if (tandem::cuda::loaded()) GTEST_SKIP() << "the module is loaded already (a driver is present)";
  ::setenv("TANDEM_CUDA_MODULE", "/proc/self/status", 1);
  EXPECT_FALSE(tandem::cuda::load());
  EXPECT_NE(tandem::cuda::load_error().find("loading /proc/self/status: "), std::string::npos)
      << tandem::cuda::load_error();
  Dl_info info{};
  ASSERT_NE(::dladdr(reinterpret_cast<void*>(&::deflate), &info), 0);  // libz: an ELF without the parts
  ::setenv("TANDEM_CUDA_MODULE", info.dli_fname, 1);
  EXPECT_FALSE(tandem::cuda::load());
  EXPECT_EQ(tandem::cuda::load_error(), std::string(info.dli_fname) +
                                            " is not this tandem's CUDA module (its parts' version missing, "
                                            "expected " + std::to_string(tandem::cuda::kPartsVersion) + ")");
  EXPECT_FALSE(tandem::cuda::loaded());
  ::unsetenv("TANDEM_CUDA_MODULE");
}
