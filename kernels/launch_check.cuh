// Host-side checks around kernel launches, shared by the forward and backward launchers: every launch ends in
// a status that names what was launched, never in a silent sticky error.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "errors.h"

namespace selscan::kern {

// A kernel-choice override from the environment (SELSCAN_FWD_KERNEL, SELSCAN_BWD_KERNEL): `warp` or `ts` forces
// that kernel (tests and A/B benchmarks; a forced ts kernel still falls back where it cannot serve the problem);
// unset, `auto` or anything else lets the launcher choose. Callers read it once per process.
enum class KernelChoice { automatic, warp, ts };
inline KernelChoice kernel_choice_from_env(const char* var) {
  const char* e = std::getenv(var);
  const std::string v = e != nullptr ? e : "";
  if (v == "warp") return KernelChoice::warp;
  if (v == "ts") return KernelChoice::ts;
  return KernelChoice::automatic;
}

// SUCCESS, or CUDA_ERROR naming `what` with the error of the launch (or API call) just made.
inline Status launch_status(const std::string& what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return fail(SELSCAN_STATUS_CUDA_ERROR,
                what + " failed: " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e));
  return SELSCAN_STATUS_SUCCESS;
}

// Raises a kernel's dynamic shared memory limit when it needs more than the default 48 KB.
template <typename Kernel>
Status set_smem(Kernel* kernel, size_t smem, const char* what) {
  if (smem <= 48 * 1024) return SELSCAN_STATUS_SUCCESS;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)) !=
      cudaSuccess)
    return launch_status(std::string(what) + ": cudaFuncSetAttribute(shared memory)");
  return SELSCAN_STATUS_SUCCESS;
}

}  // namespace selscan::kern
