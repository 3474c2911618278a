// The conv1d launchers declared in src/cuda/launch.h: the itype switch to the instances of f32.cu, f16.cu, bf16.cu;
// and the one kernel that reads no itype tensor, the backward's dweight/dbias finalize (one instance for all).
#include <cuda_runtime.h>

#include "../common/launch.cuh"
#include "common.cuh"
#include "cuda/launch.h"

namespace selscan::kern::conv1d {
using cuda::Conv1dPlan;
using cuda::Launch;
Status fwd_f32(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status fwd_f16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status fwd_bf16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_f32(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_f16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status bwd_bf16(const Conv1d& p, const Conv1dPlan& plan, const Launch& l);
Status update_f32(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);
Status update_f16(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);
Status update_bf16(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l);

// ---------------------------------------------------------------------------------------------- finalize
// 32 channels a block: warp j sums parts j, j + 8, ... in order, then warp 0 adds the 8 sums in order and writes
// dweight (and dbias) in their dtype. Parts 0 (an empty call) write zeros.
constexpr int kFinalizeThreads = 256;
__global__ void __launch_bounds__(kFinalizeThreads) bwd_finalize(const Conv1d p, int64_t parts, const float* ws) {
  constexpr int kWarps = kFinalizeThreads / 32, kMaxW1 = kMaxW + 1;
  const int lane = static_cast<int>(threadIdx.x) & 31, wi = static_cast<int>(threadIdx.x) >> 5;
  const int W1 = static_cast<int>(p.width) + 1;
  const int64_t d = static_cast<int64_t>(blockIdx.x) * 32 + lane;
  float acc[kMaxW1] = {};
  if (d < p.dim) {
    for (int64_t j = wi; j < parts; j += kWarps) {
      const float* src = ws + j * W1 * p.dim + d;
#pragma unroll
      for (int k = 0; k < kMaxW1; ++k)
        if (k < W1) acc[k] += src[k * p.dim];
    }
  }
  __shared__ float red[kWarps][kMaxW1][32];
#pragma unroll
  for (int k = 0; k < kMaxW1; ++k) red[wi][k][lane] = acc[k];
  __syncthreads();
  if (wi != 0 || d >= p.dim) return;
  for (int k = 0; k < W1; ++k) {
    float v = red[0][k][lane];
#pragma unroll
    for (int j = 1; j < kWarps; ++j) v += red[j][k][lane];
    if (k < W1 - 1) st_dtype(p.dwtype, p.dweight.p, d * p.dweight.s[0] + k * p.dweight.s[1], v);
    else if (p.dbias.p != nullptr) st_dtype(p.dwtype, p.dbias.p, d * p.dbias.s[0], v);
  }
}

Status finalize_dweight(const Conv1d& p, int64_t parts, const float* ws, cudaStream_t s) {
  const int64_t blocks = (p.dim + 31) / 32;
  bwd_finalize<<<static_cast<unsigned>(blocks), kFinalizeThreads, 0, s>>>(p, parts, ws);
  return launch_status("conv1d backward (dweight)");
}

}  // namespace selscan::kern::conv1d

namespace selscan::cuda {

Status launch_conv1d_fwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::fwd_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::fwd_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::fwd_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d forward launcher: itype is not f32/f16/bf16");
}

Status launch_conv1d_bwd(const Conv1d& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::bwd_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::bwd_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::bwd_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d backward launcher: itype is not f32/f16/bf16");
}

Status launch_conv1d_update(const Conv1dUpdate& p, const Conv1dPlan& plan, const Launch& l) {
  switch (p.itype) {
    case Dtype::f32: return kern::conv1d::update_f32(p, plan, l);
    case Dtype::f16: return kern::conv1d::update_f16(p, plan, l);
    case Dtype::bf16: return kern::conv1d::update_bf16(p, plan, l);
    default: break;
  }
  return fail(SELSCAN_STATUS_INTERNAL, "conv1d update launcher: itype is not f32/f16/bf16");
}

}  // namespace selscan::cuda
