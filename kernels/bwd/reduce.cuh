// What both backward kernels (warp.cuh, ts.cuh) share: their parameters, the float4 atomic add into the variable
// dB/dC images, and the kernel that finishes every backward (bwd_finish): the fixed-order sums over batch of the
// per-(b,d) partials (dA, constant dB/dC, dD, ddelta_bias) and the conversion of the fp32 dB/dC images into the itype
// outputs.
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

// dA, constant dB/dC, dD, ddelta_bias: fixed-order sums over batch of the per-(b,d) partials, by block `block` of
// `blocks`.
template <bool kC>
__device__ void params_part(const Args& args, int64_t block, int64_t blocks) {
  using W = typename Weights<kC>::W;
  const Problem& p = args.p;
  const int64_t N = p.dstate, D = p.dim, Bt = p.batch;
  const W* pw = reinterpret_cast<const W*>(args.pw);
  const int64_t stride = blocks * blockDim.x;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < D * N; i += stride) {
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
  for (int64_t d = block * blockDim.x + threadIdx.x; d < D; d += stride) {
    float sD = 0.f, sb = 0.f;
    for (int64_t b = 0; b < Bt; ++b) {
      sD += args.ps[b * D + d];
      sb += args.ps[(Bt + b) * D + d];
    }
    if ((p.dD.p != nullptr)) static_cast<float*>(p.dD.p)[d * p.dD.s[0]] = sD;
    if ((p.ddelta_bias.p != nullptr)) static_cast<float*>(p.ddelta_bias.p)[d * p.ddelta_bias.s[0]] = sb;
  }
}

// Variable dB/dC: the fp32 image(s) (summed over `nimg` slot partials in order) into the itype view, by block
// `block` of `blocks`.
template <typename T>
__device__ void var_out_part(const float* img, int64_t nimg, int64_t img_elems, int64_t Lp, const View& out,
                             int64_t G, int64_t N, int64_t Lr, int64_t rows, int64_t block, int64_t blocks) {
  const int64_t stride = blocks * blockDim.x;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < rows * Lr; i += stride) {
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

// The block ranges of bwd_finish: its first `params` blocks sum the parameters, the next `dB` blocks convert
// dB, the last `dC` blocks dC. One launch instead of three: the backward is short on large batches of small calls,
// where each launch costs the caller microseconds of host time.
struct FinishGrid {
  int64_t params, dB, dC;
  int64_t images;  // dB/dC images summed per element (the plan's; 1 unless deterministic)
};

template <typename T, bool kC>
__global__ void bwd_finish(const Args args, const FinishGrid g) {
  const Problem& p = args.p;
  const int64_t b = blockIdx.x;
  if (b < g.params) {
    params_part<kC>(args, b, g.params);
    return;
  }
  const int64_t Lr = p.seqlen * (kC ? 2 : 1), rows = p.rows() * p.groups * p.dstate;
  const int64_t nimg = g.images;
  if (b < g.params + g.dB)
    var_out_part<T>(args.vb, nimg, args.var_elems, args.var_row, p.dB, p.groups, p.dstate, Lr, rows, b - g.params,
                    g.dB);
  else
    var_out_part<T>(args.vc, nimg, args.var_elems, args.var_row, p.dC, p.groups, p.dstate, Lr, rows,
                    b - g.params - g.dB, g.dC);
}

}  // namespace selscan::kern::bwd

