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

// What bwd_finish reads: the sizes, the parameter gradients' views and the workspace regions, and no more. The
// runtime copies a kernel's argument into every launch, so this short struct instead of Args (a whole Problem,
// ~1.3 KB) is part of the backward's host cost.
struct FinishArgs {
  int64_t batch, dim, dstate, groups;
  int64_t Lr;    // itype elements per row of variable dB/dC: L, or 2L for complex weights
  int64_t rows;  // rows of a variable dB/dC image: batch rows (1 when packed) * groups * dstate
  int64_t var_elems, var_row;
  int64_t images;  // dB/dC images summed per element (the plan's; 1 unless deterministic)
  int accB, accC;
  bool var_B, var_C;
  View dA, dB, dC, dD, ddelta_bias;
  const float* pw;
  const float* ps;
  const float* vb;
  const float* vc;
};

// dA, constant dB/dC, dD, ddelta_bias: fixed-order sums over batch of the per-(b,d) partials, by block `block` of
// `blocks`.
template <bool kC>
__device__ void params_part(const FinishArgs& f, int64_t block, int64_t blocks) {
  using W = typename Weights<kC>::W;
  const int64_t N = f.dstate, D = f.dim, Bt = f.batch;
  const W* pw = reinterpret_cast<const W*>(f.pw);
  const int64_t stride = blocks * blockDim.x;
  for (int64_t i = block * blockDim.x + threadIdx.x; i < D * N; i += stride) {
    const int64_t d = i / N, n = i % N;
    W sA = wzero<W>(), sB = wzero<W>(), sC = wzero<W>();
    for (int64_t b = 0; b < Bt; ++b) {
      sA = wadd(sA, pw[(b * D + d) * N + n]);
      if (f.accB >= 0) sB = wadd(sB, pw[((f.accB * Bt + b) * D + d) * N + n]);
      if (f.accC >= 0) sC = wadd(sC, pw[((f.accC * Bt + b) * D + d) * N + n]);
    }
    st_w<kC>(f.dA.p, d * f.dA.s[0] + n * f.dA.s[1], sA);
    if (!f.var_B) st_w<kC>(f.dB.p, d * f.dB.s[0] + n * f.dB.s[1], sB);
    if (!f.var_C) st_w<kC>(f.dC.p, d * f.dC.s[0] + n * f.dC.s[1], sC);
  }
  for (int64_t d = block * blockDim.x + threadIdx.x; d < D; d += stride) {
    float sD = 0.f, sb = 0.f;
    for (int64_t b = 0; b < Bt; ++b) {
      sD += f.ps[b * D + d];
      sb += f.ps[(Bt + b) * D + d];
    }
    if ((f.dD.p != nullptr)) static_cast<float*>(f.dD.p)[d * f.dD.s[0]] = sD;
    if ((f.ddelta_bias.p != nullptr)) static_cast<float*>(f.ddelta_bias.p)[d * f.ddelta_bias.s[0]] = sb;
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
};

template <typename T, bool kC>
__global__ void bwd_finish(const FinishArgs f, const FinishGrid g) {
  const int64_t b = blockIdx.x;
  if (b < g.params) {
    params_part<kC>(f, b, g.params);
    return;
  }
  if (b < g.params + g.dB)
    var_out_part<T>(f.vb, f.images, f.var_elems, f.var_row, f.dB, f.groups, f.dstate, f.Lr, f.rows, b - g.params,
                    g.dB);
  else
    var_out_part<T>(f.vc, f.images, f.var_elems, f.var_row, f.dC, f.groups, f.dstate, f.Lr, f.rows,
                    b - g.params - g.dB, g.dC);
}

}  // namespace selscan::kern::bwd

