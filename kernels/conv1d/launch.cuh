// The conv1d plan's kernels for one itype: the width switch, the launch shapes of src/cuda/select.cpp's plan, and a
// status after each launch. Included once per itype (f32.cu, f16.cu, bf16.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../common/launch.cuh"
#include "bwd.cuh"
#include "fwd.cuh"
#include "update.cuh"

namespace selscan::kern::conv1d {

// Calls f with std::integral_constant<int, W> for the call's width; false for a width no kernel serves.
template <typename F>
bool by_width(int64_t width, F&& f) {
  switch (width) {
    case 2: f(std::integral_constant<int, 2>{}); return true;
    case 3: f(std::integral_constant<int, 3>{}); return true;
    case 4: f(std::integral_constant<int, 4>{}); return true;
    default: return false;
  }
}

inline Status bad_width(const char* what, int64_t width) {
  return fail(SELSCAN_STATUS_INTERNAL, std::string(what) + ": no kernel for width " + std::to_string(width));
}

// Blocks of a grid-stride kernel over n items, kThreads a block (n > 0).
inline unsigned stride_grid(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 0x7fffffff ? blocks : 0x7fffffff);
}

template <typename T>
Status launch_fwd(const Conv1d& p, const Conv1dPlan& plan, const cuda::Launch& l) {
  const cudaStream_t s = static_cast<cudaStream_t>(l.stream);
  if (plan.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(plan.blocks));
    const bool ok = by_width(p.width, [&](auto wc) {
      constexpr int W = decltype(wc)::value;
      if (plan.kernel == cuda::Conv1dKernel::cl) fwd_cl<T, W><<<grid, kThreads, 0, s>>>(p, plan);
      else if (p.plain_fwd()) fwd_plain<T, W><<<grid, kThreads, 0, s>>>(p, plan);
      else fwd_rows<T, W><<<grid, kThreads, 0, s>>>(p, plan);
    });
    if (!ok) return bad_width("conv1d forward", p.width);
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
  if (plan.blocks > 0) {
    const dim3 grid(static_cast<unsigned>(plan.blocks));
    const bool ok = by_width(p.width, [&](auto wc) {
      constexpr int W = decltype(wc)::value;
      if (plan.kernel == cuda::Conv1dKernel::cl) bwd_cl<T, W><<<grid, kThreads, 0, s>>>(p, plan, ws);
      else if (p.plain_bwd()) bwd_plain<T, W><<<grid, kThreads, 0, s>>>(p, plan, ws);
      else bwd_rows<T, W><<<grid, kThreads, 0, s>>>(p, plan, ws);
    });
    if (!ok) return bad_width("conv1d backward", p.width);
    if (Status st = launch_status("conv1d backward"); st != SELSCAN_STATUS_SUCCESS) return st;
  }
  if (!plan.direct) {  // an empty call (no main kernel) writes zeros here
    const int64_t fblocks = (p.dim + 31) / 32;
    bwd_finalize<T><<<static_cast<unsigned>(fblocks), kFinalizeThreads, 0, s>>>(p, plan.blocks > 0 ? plan.parts : 0,
                                                                              ws);
    if (Status st = launch_status("conv1d backward (dweight)"); st != SELSCAN_STATUS_SUCCESS) return st;
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
  if (plan.blocks == 0) return SELSCAN_STATUS_SUCCESS;
  const dim3 grid(static_cast<unsigned>(plan.blocks));
  const bool ok = by_width(p.width, [&](auto wc) {
    constexpr int W = decltype(wc)::value;
    if (p.state_t == Dtype::f32) update_kernel<T, float, W><<<grid, kThreads, 0, s>>>(p, plan);
    else update_kernel<T, T, W><<<grid, kThreads, 0, s>>>(p, plan);
  });
  if (!ok) return bad_width("conv1d update", p.width);
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
