// The conv1d plan's kernels for one itype: the launch shapes of src/cuda/select.cpp's plan, and a status after each
// launch. Included once per itype (f32.cu, f16.cu, bf16.cu). One instance of each kernel serves every width
// (common.cuh, "width").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/launch.cuh"
#include "bwd.cuh"
#include "fwd.cuh"
#include "update.cuh"

namespace selscan::kern::conv1d {

// The kernels index kMaxW - 1 columns before a window and need at least the last two taps live.
inline bool width_ok(int64_t width) { return width >= 2 && width <= kMaxW; }

inline Status bad_width(const char* what, int64_t width) {
  return fail(SELSCAN_STATUS_INTERNAL, std::string(what) + ": no kernel for width " + std::to_string(width) +
                                           " (the kernels serve widths 2 to " + std::to_string(kMaxW) + ")");
}

// Blocks of a grid-stride kernel over n items, kThreads a block (n > 0).
inline unsigned stride_grid(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 0x7fffffff ? blocks : 0x7fffffff);
}

template <typename T>
Status launch_fwd(const Conv1d& p, const Conv1dPlan& plan, const cuda::Launch& l) {
  const cudaStream_t s = static_cast<cudaStream_t>(l.stream);
  if (!width_ok(p.width)) return bad_width("conv1d forward", p.width);
  if (plan.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(plan.blocks));
    if (plan.kernel == cuda::Conv1dKernel::cl) fwd_cl<T><<<grid, kThreads, 0, s>>>(p, plan);
    else if (p.plain_fwd()) fwd_plain<T><<<grid, kThreads, 0, s>>>(p, plan);
    else fwd_rows<T><<<grid, kThreads, 0, s>>>(p, plan);
    if (Status st = launch_status("conv1d forward"); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  if (plan.states && p.batch * p.dim > 0) {
    fwd_states<T><<<stride_grid(p.batch * p.dim), kThreads, 0, s>>>(p);
    if (Status st = launch_status("conv1d forward (states)"); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  return SELSCAN_STATUS_SUCCESS;
}

template <typename T>
Status launch_bwd(const Conv1d& p, const Conv1dPlan& plan, const cuda::Launch& l) {
  const cudaStream_t s = static_cast<cudaStream_t>(l.stream);
  float* ws = static_cast<float*>(l.workspace);
  if (plan.workspace > 0 && ws == nullptr)
    return fail(SELSCAN_STATUS_INTERNAL, "conv1d backward: the plan's workspace is missing");
  if (!width_ok(p.width)) return bad_width("conv1d backward", p.width);
  if (plan.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(plan.blocks));
    if (plan.kernel == cuda::Conv1dKernel::cl) bwd_cl<T><<<grid, kThreads, 0, s>>>(p, plan, ws);
    else if (p.plain_bwd()) bwd_plain<T><<<grid, kThreads, 0, s>>>(p, plan, ws);
    else bwd_rows<T><<<grid, kThreads, 0, s>>>(p, plan, ws);
    if (Status st = launch_status("conv1d backward"); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  if (!plan.direct) {  // an empty call (no main kernel) writes zeros here
    if (Status st = finalize_dweight(p, plan.blocks > 0 ? plan.parts : 0, ws, s); st != SELSCAN_STATUS_SUCCESS)
      return st;
  }
  if (plan.states && p.batch * p.dim > 0) {
    bwd_dinit<T><<<stride_grid(p.batch * p.dim), kThreads, 0, s>>>(p);
    if (Status st = launch_status("conv1d backward (dinitial_states)"); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  return SELSCAN_STATUS_SUCCESS;
}

template <typename T>
Status launch_update(const Conv1dUpdate& p, const Conv1dPlan& plan, const cuda::Launch& l) {
  const cudaStream_t s = static_cast<cudaStream_t>(l.stream);
  if (!width_ok(p.width)) return bad_width("conv1d update", p.width);
  if (plan.blocks == 0) return SELSCAN_STATUS_SUCCESS;
  const dim3 grid(static_cast<unsigned>(plan.blocks));
  if (p.state_t == Dtype::f32) update_kernel<T, float><<<grid, kThreads, 0, s>>>(p, plan);
  else update_kernel<T, T><<<grid, kThreads, 0, s>>>(p, plan);
  return launch_status("conv1d update");
}

}  // namespace selscan::kern::conv1d

// One itype's launchers, defined in its translation unit.
#define SELSCAN_CONV1D_LAUNCHERS(suffix, T)                                                                  \
  namespace selscan::kern::conv1d {                                                                           \
  Status fwd_##suffix(const Conv1d& p, const Conv1dPlan& plan, const cuda::Launch& l) {                       \
    return launch_fwd<T>(p, plan, l);                                                                         \
  }                                                                                                           \
  Status bwd_##suffix(const Conv1d& p, const Conv1dPlan& plan, const cuda::Launch& l) {                       \
    return launch_bwd<T>(p, plan, l);                                                                         \
  }                                                                                                           \
  Status update_##suffix(const Conv1dUpdate& p, const Conv1dPlan& plan, const cuda::Launch& l) {              \
    return launch_update<T>(p, plan, l);                                                                      \
  }                                                                                                           \
  }
