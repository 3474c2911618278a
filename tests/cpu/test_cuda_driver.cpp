// What a CUDA build says about the NVIDIA driver: the driver branch each toolkit's runtime needs, and the message on a
// machine with no driver at all (libcuda.so.1 absent: a container without the driver mounted, a CPU-only host), which
// must not claim the driver is merely old. Needs a CUDA build; the no-driver case runs only where there is no driver.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <string>

#include "selscan/selscan.h"

#if SELSCAN_WITH_CUDA
#include "cuda/arch.h"
#endif

namespace selscan_test {
namespace {

TEST(CudaDriver, FloorPerToolkitMajor) {
#if SELSCAN_WITH_CUDA
  EXPECT_EQ(selscan::cuda::driver_floor(13), 580);
  EXPECT_EQ(selscan::cuda::driver_floor(12), 525);  // minor-version compatibility across 12.x
  EXPECT_EQ(selscan::cuda::driver_floor(11), 450);
  EXPECT_EQ(selscan::cuda::driver_floor(10), 0);
#else
  GTEST_SKIP() << "CPU-only build: no CUDA runtime, no driver floor";
#endif
}

TEST(CudaDriver, MissingDriverIsNamedAsMissing) {
#if SELSCAN_WITH_CUDA
  if (void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(h);
    GTEST_SKIP() << "an NVIDIA driver (libcuda.so.1) is installed here";
  }
  EXPECT_EQ(selscan_check_device(0), SELSCAN_STATUS_NO_DEVICE);
  const std::string msg = selscan_last_error();
  EXPECT_NE(msg.find("no NVIDIA driver found (libcuda.so.1 could not be loaded)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("or newer"), std::string::npos) << msg;  // which driver branch the build needs
  EXPECT_EQ(msg.find("older than"), std::string::npos) << msg;
  int32_t n = -1;
  EXPECT_EQ(selscan_cuda_device_count(&n), SELSCAN_STATUS_SUCCESS);
  EXPECT_EQ(n, 0);
#else
  GTEST_SKIP() << "CPU-only build: the CUDA device layer is not built";
#endif
}

}  // namespace
}  // namespace selscan_test
