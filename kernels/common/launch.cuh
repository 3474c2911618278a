// Host-side checks around kernel launches, shared by the forward and backward launchers: every launch ends in
// a status that names what was launched, never in a silent sticky error; a kernel's shared-memory limit is raised
// once per device, not on every launch.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <string>

#include "cuda/launch.h"
#include "errors.h"

namespace selscan::kern {

// SUCCESS, or CUDA_ERROR naming `what` with the error of the launch (or API call) just made. Formats only on failure.
inline Status launch_status(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e == cudaSuccess) return SELSCAN_STATUS_SUCCESS;
  return fail(SELSCAN_STATUS_CUDA_ERROR,
              std::string(what) + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
}

// Dynamic shared memory a kernel may use without opting in.
constexpr size_t kDefaultSmem = 48 * 1024;

// Whether one kernel's dynamic shared-memory limit has been raised on each device. The limit is per-device state set by
// a driver call, so it is raised once per (kernel, device), to the device's whole opt-in limit: later launches of any
// size the plan allows need no call, and concurrent launches of different sizes cannot lower it under each other.
// Launchers keep one static instance per kernel; its flags start false (constant-initialised, no guard).
class SmemLimit {
 public:
  template <typename Kernel>
  Status raise(Kernel* kernel, size_t smem, const cuda::Launch& l, const char* what) {
    if (smem <= kDefaultSmem) return SELSCAN_STATUS_SUCCESS;
    const bool cached = l.device >= 0 && l.device < kDevices;
    if (cached && raised_[l.device].load(std::memory_order_acquire)) return SELSCAN_STATUS_SUCCESS;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(l.smem_optin)) !=
        cudaSuccess)
      return launch_status(what);
    if (cached) raised_[l.device].store(true, std::memory_order_release);
    return SELSCAN_STATUS_SUCCESS;
  }

 private:
  static constexpr int kDevices = 64;  // ordinals past this call the driver every time
  std::atomic<bool> raised_[kDevices];
};

}  // namespace selscan::kern
