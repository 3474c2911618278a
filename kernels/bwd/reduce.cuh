// What both backward kernels (warp.cuh, ts.cuh) share: their parameters, the float4 atomic add into the variable
// dB/dC images, and the two kernels that finish every backward: the fixed-order sums over batch of the per-(b,d)
// partials (dA, constant dB/dC, dD, ddelta_bias) and the conversion of the fp32 dB/dC images into the itype outputs.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../common/io.cuh"
#include "../common/math.cuh"
#include "problem.h"

namespace selscan::kern::bwd {

// The parameters of every backward kernel: the Problem, the plan's layout (src/cuda/plans.h) and the workspace
// regions.
struct Args {
  Problem p;
  int64_t tiles_per_group, slots, tiles_per_slot;
  int64_t var_elems;  // floats of one variable dB/dC image: Bt*G*N*Lp
  int64_t var_row;    // Lp: its row length, L*cw rounded up to whole float4
  int stile, nacc, accB, accC;
  bool det_var, lane_acc;
  float* pw;  // [nacc][Bt][D][N] weights-typed partials (float or float2)
  float* ps;  // [2][Bt][D]: dD, ddelta_bias partials
  float* vb;  // variable dB fp32 image(s): [slots or 1][Bt][G][N][Lp]
  float* vc;  // variable dC likewise
};

__device__ __forceinline__ void add_f4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float4*>(dst), v);
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

// dA, constant dB/dC, dD, ddelta_bias: fixed-order sums over batch of the per-(b,d) partials.
template <bool kC>
__global__ void bwd_params(const Args args) {
  using W = typename Weights<kC>::W;
  const Problem& p = args.p;
  const int64_t N = p.dstate, D = p.dim, Bt = p.batch;
  const W* pw = reinterpret_cast<const W*>(args.pw);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < D * N; i += stride) {
    const int64_t d = i / N, n = i % N;
    W sA = wzero<W>(), sB = wzero<W>(), sC = wzero<W>();
    for (int64_t b = 0; b < Bt; ++b) {
      sA = wadd(sA, pw[(b * D + d) * N + n]);
      if (args.accB >= 0) sB = wadd(sB, pw[((args.accB * Bt + b) * D + d) * N + n]);
      if (args.accC >= 0) sC = wadd(sC, pw[((args.accC * Bt + b) * D + d) * N + n]);
    }
    st_w<kC>(p.dA.p, d * p.dA.s[0] + n * p.dA.s[1], sA);
    if (!p.var_B) st_w<kC>(p.dB.p, d * p.dB.s[0] + n * p.dB.s[1], sB);
    if (!p.var_C) st_w<kC>(p.dC.p, d * p.dC.s[0] + n * p.dC.s[1], sC);
  }
  for (int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; d < D; d += stride) {
    float sD = 0.f, sb = 0.f;
    for (int64_t b = 0; b < Bt; ++b) {
      sD += args.ps[b * D + d];
      sb += args.ps[(Bt + b) * D + d];
    }
    if ((p.dD.p != nullptr)) static_cast<float*>(p.dD.p)[d * p.dD.s[0]] = sD;
    if ((p.ddelta_bias.p != nullptr)) static_cast<float*>(p.ddelta_bias.p)[d * p.ddelta_bias.s[0]] = sb;
  }
}

// Variable dB/dC: the fp32 image(s) (summed over `nimg` slot partials in order) into the itype view.
template <typename T>
__global__ void bwd_var_out(const float* img, int64_t nimg, int64_t img_elems, int64_t Lp, View out, int64_t G,
                            int64_t N, int64_t Lr, int64_t rows) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * Lr; i += stride) {
    const int64_t t = i % Lr;
    const int64_t row = i / Lr;
    float s = 0.f;
    for (int64_t j = 0; j < nimg; ++j) s += img[j * img_elems + row * Lp + t];
    const int64_t n = row % N;
    const int64_t g = (row / N) % G;
    const int64_t b = row / (N * G);
    static_cast<T*>(out.p)[b * out.s[0] + g * out.s[1] + n * out.s[2] + t] = from_f32<T>(s);
  }
}

}  // namespace selscan::kern::bwd
