// DeviceMemory (tests/common/case.h) over cudaMalloc / cudaMemcpy / cudaFree, for the GPU tests that run a case
// on device copies. tests/common stays free of device headers, so this lives with the GPU tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <functional>
#include <utility>

#include "case.h"

namespace selscan_test {

// `sync` waits for the call's work: by default the whole device, checked; the size-limit tests pass one that
// gives up on a hung kernel.
inline DeviceMemory cuda_memory(
    std::function<void()> sync = [] { EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess); }) {
  DeviceMemory m;
  m.alloc = [](size_t n) -> void* {
    void* p = nullptr;
    return cudaMalloc(&p, n) == cudaSuccess ? p : nullptr;
  };
  m.to_device = [](void* d, const void* h, size_t n) {
    EXPECT_EQ(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice), cudaSuccess);
  };
  m.to_host = [](void* h, const void* d, size_t n) {
    EXPECT_EQ(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  };
  m.release = [](void* p) { cudaFree(p); };
  m.sync = std::move(sync);
  return m;
}

}  // namespace selscan_test
