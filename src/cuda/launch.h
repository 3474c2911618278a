// Launchers of the CUDA kernels: declared here (host side), defined in kernels/ (nvcc). Only compiled into builds
// with CUDA (SELSCAN_WITH_CUDA). The caller (dispatch.cpp) has validated the Problem, chosen the kernel and its plan
// (src/cuda/select.h), checked the workspace and made `device` current; the launchers execute the plan as it is.
#pragma once

#include <cstddef>
#include <cstdint>

#include "conv1d.h"
#include "cuda/plans.h"
#include "errors.h"
#include "problem.h"

namespace selscan::cuda {

// Where a plan runs.
struct Launch {
  void* stream = nullptr;    // a cudaStream_t
  int device = 0;            // the current device (per-device kernel attributes are set once per device)
  int64_t smem_optin = 0;    // its per-block opt-in shared memory
  void* workspace = nullptr; // the plan's workspace (the backward's BwdPlan::total bytes)
};

// Enqueue on l.stream. No allocation, no synchronisation. Returns SUCCESS or CUDA_ERROR (via fail(), with the CUDA
// error string) after checking cudaGetLastError() after each launch.
Status launch_fwd(const Problem& p, const FwdPlan& plan, const Launch& l);
Status launch_bwd(const Problem& p, const BwdPlan& plan, const Launch& l);

// The causal conv1d (kernels/conv1d/): the plan's kernels on l.stream; the backward's partial sums live in
// l.workspace (plan.workspace bytes). Same contract as above.
Status launch_conv1d_fwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status launch_conv1d_bwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status launch_conv1d_update(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);

}  // namespace selscan::cuda
