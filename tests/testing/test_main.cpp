// The tests' main: GoogleTest's, after the CUDA module where a driver is
// (Note [CUDA as a module] in tandem/util/cuda_module.h), so that a test's
// torch::cuda::is_available() sees the GPU.
#include <gtest/gtest.h>

#include "tandem/util/cuda_module.h"

int main(int argc, char** argv) {
  tandem::cuda::load_when_present();
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
