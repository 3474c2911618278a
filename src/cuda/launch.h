// Launchers of the CUDA kernels: declared here (host side), defined in kernels/ (nvcc). Only compiled into
// builds with CUDA (SELSCAN_WITH_CUDA). The caller (dispatch.cpp) has already validated the Problem, made
// `device` current and checked that the device is served by this build.
#pragma once

#include <cstddef>

#include "errors.h"
#include "problem.h"

namespace selscan::cuda {

// Kernel family picked by the arch-dispatch layer from the device's compute capability and the targets the
// build carries (src/cuda/arch.cpp). Families are tuning choices; every family computes the same function.
enum class Family : int { generic = 0, sm80 = 1, sm90 = 2 };

// Bytes of device workspace the launch needs (0 allowed). Depends only on the Problem's shapes and flags.
size_t fwd_workspace_bytes(const Problem& p, Family f);
size_t bwd_workspace_bytes(const Problem& p, Family f);

// Enqueue on `stream` (a cudaStream_t). No allocation, no synchronisation. Returns SUCCESS or CUDA_ERROR
// (via fail(), with the CUDA error string) after checking cudaGetLastError() after each launch.
Status launch_fwd(const Problem& p, Family f, void* stream, void* workspace, size_t workspace_bytes);
Status launch_bwd(const Problem& p, Family f, void* stream, void* workspace, size_t workspace_bytes);

}  // namespace selscan::cuda
