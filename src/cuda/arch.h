// Run-time arch dispatch: which kernel family serves a device, from its compute capability and the SASS/PTX
// targets this build carries. Results are cached per device. Host code; needs the CUDA runtime headers.
#pragma once

#include <string>

#include "cuda/launch.h"
#include "errors.h"

namespace selscan::cuda {

// SUCCESS and the family to use on `device`; else NO_DEVICE / ARCH_MISMATCH / CUDA_ERROR with a message that
// names the device, what the build carries and the rebuild command. Launches nothing.
Status select_family(int device, Family* family);
// Visible devices (0 without a driver). Never fails.
int device_count();
// "SASS sm_80 sm_90; PTX compute_90" from the build configuration.
std::string carried_targets();

// Makes `device` current for the scope of a call and restores the caller's current device afterwards, so
// nothing assumes a global current device.
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

// Defined in kernels/probe.cu: cudaFuncGetAttributes of an empty kernel on the current device, i.e. which
// embedded image the driver would load. Returns the cudaError_t as int.
int probe_image(int* binary_version, int* ptx_version);

}  // namespace selscan::cuda
