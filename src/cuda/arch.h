// The CUDA devices as the library sees them: whether this build serves a device (its compute capability against the
// SASS/PTX targets the build carries, and the image the driver really loads), the properties the kernel choice reads,
// both cached per device; the driver a build needs; the device guard. Host code; arch.cpp needs the CUDA runtime.
#pragma once

#include <string>

#include "cuda/select.h"
#include "errors.h"

namespace selscan::cuda {

// SUCCESS and `device`'s properties (valid for the life of the process), else NO_DEVICE / ARCH_MISMATCH / CUDA_ERROR
// with a message that names the device, what the build carries and the rebuild command. The first call for a device
// decides (launching nothing) under a lock; every later call reads the cached result without one.
Status device_props(int device, const DeviceProps** props);
// Visible devices (0 without a driver). Never fails.
int device_count();
// "SASS sm_80 sm_90; PTX compute_90" from the build configuration.
std::string carried_targets();
// The oldest NVIDIA driver branch (580 for R580) that runs a library built with the CUDA `cuda_major`.x runtime:
// 13.x needs R580; 12.x runs on R525 and 11.x on R450 through minor-version compatibility. 0 when unknown.
int driver_floor(int cuda_major);

// Makes `device` current for the scope of a call and restores the caller's current device afterwards, so
// nothing assumes a global current device. Switches only when the caller's current device differs.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  Status status() const { return status_; }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
  bool switched_ = false;
  Status status_ = SELSCAN_STATUS_SUCCESS;
};

// Defined in kernels/common/probe.cu: cudaFuncGetAttributes of an empty kernel on the current device, i.e. which
// embedded image the driver would load. Returns the cudaError_t as int.
int probe_image(int* binary_version, int* ptx_version);

}  // namespace selscan::cuda
