// The one gate of every GPU test: skip, with the reason shown, when no device is usable by this build.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "selscan/selscan.h"

namespace selscan_test {

inline bool gpu_usable(std::string* why) {
  int32_t n = 0;
  if (selscan_cuda_device_count(&n) != SELSCAN_STATUS_SUCCESS || n == 0) {
    *why = "no usable CUDA device (or libselscan was built without CUDA)";
    return false;
  }
  if (selscan_check_device(0) != SELSCAN_STATUS_SUCCESS) {
    *why = std::string("device 0 is not served by this build: ") + selscan_last_error();
    return false;
  }
  return true;
}

}  // namespace selscan_test

#define REQUIRE_GPU()                                            \
  do {                                                           \
    std::string why_;                                            \
    if (!::selscan_test::gpu_usable(&why_)) GTEST_SKIP() << why_; \
  } while (0)
