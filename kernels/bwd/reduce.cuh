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

// ------------------------------------------------------------------------------------------ folded finishing
// With BwdPlan::fold the main kernel finishes the call itself: a block that has made its last write into a region
// counts its arrival there, and the block whose arrival completes the count finishes that region, by the same sums
// in the same order as bwd_finish (so the outputs are bit-identical to the separate launch's, and deterministic mode
// stays deterministic). Regions:
// - parameter region (g, t): the channels of channel tile t of group g (warp-scan: a slot's tiles; thread-states:
//   32 channels), complete once its `batch` blocks (one per sequence) have written their per-(b, d) partials; its
//   finisher writes dA, constant dB/dC, dD and ddelta_bias of those channels;
// - variable region (b, g, s): time steps [s span, (s + 1) span) of the variable dB/dC rows of (b, g), complete once
//   every channel tile of the group has added (or, deterministic, stored) its dB/dC there; its finisher converts the
//   fp32 image(s) there into the itype outputs.
// No block ever waits for another, so nothing depends on which blocks are resident together. The counters are
// zeroed by the call's one memset (BwdPlan::zero_off): the workspace is the caller's and holds anything when a call
// starts, so a count cannot be left for the next call to start from; a captured CUDA graph replays that memset with
// the kernel.
struct Fold {
  unsigned* pctr;  // parameter-region counters [groups][tiles]
  unsigned* vctr;  // variable-region counters [batch][groups][spans]
  int64_t span;    // time steps per variable region
  int64_t spans;   // variable regions per (b, g)
  int64_t images;  // variable dB/dC images per tensor, summed in order (1 unless deterministic)
};

// The arrival of the calling block at the region counted by `ctr`, which completes at `count` arrivals, made by
// thread 0 alone: whether this arrival completed it. Thread 0 calls it after a __syncthreads() that follows every
// thread's last write (store or atomic) into the region. Release: that barrier orders every thread's writes before
// thread 0's fence, and the fence (cumulative) orders them before the increment, so the block that reads the final
// count has them all. Acquire: the finisher's thread 0 fences after reading the count, and the barrier through which
// it tells its block (fold_arrive, or the main kernels' __syncthreads_or at a chunk's end) passes that on. The
// finisher then reads through L2 (ld.global.cg), so no stale line in this SM's L1 can answer.
__device__ __forceinline__ bool fold_count(unsigned* ctr, unsigned count) {
  __threadfence();
  const bool last = atomicAdd(ctr, 1u) + 1u == count;
  if (last) __threadfence();
  return last;
}

// fold_count with the answer in every thread of the block. Every thread calls it, after the barrier fold_count needs.
__device__ __forceinline__ bool fold_arrive(unsigned* ctr, unsigned count) {
  const int last = threadIdx.x == 0 ? fold_count(ctr, count) : 0;
  return __syncthreads_or(last) != 0;
}

// A parameter region's finishing: params_part's sums, in its order, for the channels [d0, d1).
template <bool kC>
struct FoldParams {
  const float* pw;
  const float* ps;
  int64_t batch, dim, dstate, d0, d1;
  int accB, accC;
  bool var_B, var_C;
  View dA, dB, dC, dD, ddelta_bias;
};

template <bool kC>
__device__ __forceinline__ void fold_params_run(const FoldParams<kC> j) {
  using W = typename Weights<kC>::W;
  const int64_t N = j.dstate, D = j.dim, Bt = j.batch;
  const W* pw = reinterpret_cast<const W*>(j.pw);
  for (int64_t i = threadIdx.x; i < (j.d1 - j.d0) * N; i += blockDim.x) {
    const int64_t d = j.d0 + i / N, n = i % N;
    W sA = wzero<W>(), sB = wzero<W>(), sC = wzero<W>();
    for (int64_t b = 0; b < Bt; ++b) {
      sA = wadd(sA, __ldcg(pw + (b * D + d) * N + n));
      if (j.accB >= 0) sB = wadd(sB, __ldcg(pw + ((j.accB * Bt + b) * D + d) * N + n));
      if (j.accC >= 0) sC = wadd(sC, __ldcg(pw + ((j.accC * Bt + b) * D + d) * N + n));
    }
    st_w<kC>(j.dA.p, d * j.dA.s[0] + n * j.dA.s[1], sA);
    if (!j.var_B) st_w<kC>(j.dB.p, d * j.dB.s[0] + n * j.dB.s[1], sB);
    if (!j.var_C) st_w<kC>(j.dC.p, d * j.dC.s[0] + n * j.dC.s[1], sC);
  }
  for (int64_t d = j.d0 + threadIdx.x; d < j.d1; d += blockDim.x) {
    float sD = 0.f, sb = 0.f;
    for (int64_t b = 0; b < Bt; ++b) {
      sD += __ldcg(j.ps + b * D + d);
      sb += __ldcg(j.ps + (Bt + b) * D + d);
    }
    if (j.dD.p != nullptr) static_cast<float*>(j.dD.p)[d * j.dD.s[0]] = sD;
    if (j.ddelta_bias.p != nullptr) static_cast<float*>(j.ddelta_bias.p)[d * j.ddelta_bias.s[0]] = sb;
  }
}

// The parameter region of channels [d0, d1): if this block's arrival completes its `count` (the batch), its finishing.
// Every thread of the block calls it, after a barrier that follows its last write of those channels' partials.
template <bool kC>
__device__ __forceinline__ void fold_params_region(const Args& a, unsigned* ctr, unsigned count, int64_t d0,
                                                   int64_t d1) {
  if (!fold_arrive(ctr, count)) return;
  const Problem& p = a.p;
  fold_params_run<kC>(FoldParams<kC>{a.pw, a.ps, p.batch, p.dim, p.dstate, d0, d1, a.accB, a.accC, p.var_B,
                                     p.var_C, p.dA, p.dB, p.dC, p.dD, p.ddelta_bias});
}

// A variable region's finishing for one tensor: var_out_part's sums (images in order) over `nrows` rows of the image
// from `rows` (the outputs' rows from `out`, `ostride` apart) and their floats [t0, t1) (t0 a multiple of 4; complex
// weights: 2 floats a step). A thread takes kU float4 of the rows at a time and loads them all before it stores, so
// its L2 reads overlap (as far as the compiler knows, the stores could alias the loads). A float4 past t1 stays
// inside its row: rows are padded to whole float4.
template <typename T>
__device__ __forceinline__ void fold_var_run(const float* rows, int64_t nimg, int64_t img_elems, int64_t Lp,
                                          int64_t nrows, T* out, int64_t ostride, int64_t t0, int64_t t1) {
  constexpr int kU = 4;
  const int64_t q = (t1 - t0 + 3) / 4;  // float4 per row
  const int64_t items = nrows * q;
  const int64_t step = static_cast<int64_t>(blockDim.x);
  for (int64_t i0 = threadIdx.x; i0 < items; i0 += kU * step) {
    float4 s[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = i0 + u * step;
      s[u] = make_float4(0.f, 0.f, 0.f, 0.f);
      if (i >= items) continue;
      const float* src = rows + (i / q) * Lp + t0 + 4 * (i % q);
      for (int64_t j = 0; j < nimg; ++j) {
        const float4 v = __ldcg(reinterpret_cast<const float4*>(src + j * img_elems));
        s[u].x += v.x;
        s[u].y += v.y;
        s[u].z += v.z;
        s[u].w += v.w;
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t i = i0 + u * step;
      if (i >= items) continue;
      const int64_t t = t0 + 4 * (i % q);
      T* dst = out + (i / q) * ostride + t;
      const float e[4] = {s[u].x, s[u].y, s[u].z, s[u].w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (t + k < t1) dst[k] = from_f32<T>(e[k]);
    }
  }
}

// The variable region (b, g, s) of a call of L steps: both tensors' finishing (by the block that completed it).
// The main kernels count their arrivals at variable regions inside their time loops (fold_count, thread 0 keeping a
// mask of the regions it completed) and finish those regions at the end of each chunk, out of the hot loops: inlined
// there, this code changed the register allocation of the scan loops (more spills, ptxas sm_90).
template <typename T, int kCw>
__device__ __forceinline__ void fold_var_region(const Args& a, const Fold& f, int64_t b, int64_t g, int64_t s,
                                                int64_t L) {
  const Problem& p = a.p;
  const int64_t t0 = s * f.span * kCw;
  const int64_t t1 = ((s + 1) * f.span < L ? (s + 1) * f.span : L) * kCw;
  const int64_t row0 = (b * p.groups + g) * p.dstate * a.var_row;  // the (b, g) rows of an image
  if (p.var_B)
    fold_var_run<T>(a.vb + row0, f.images, a.var_elems, a.var_row, p.dstate,
                    static_cast<T*>(p.dB.p) + b * p.dB.s[0] + g * p.dB.s[1], p.dB.s[2], t0, t1);
  if (p.var_C)
    fold_var_run<T>(a.vc + row0, f.images, a.var_elems, a.var_row, p.dstate,
                    static_cast<T*>(p.dC.p) + b * p.dC.s[0] + g * p.dC.s[1], p.dC.s[2], t0, t1);
}

}  // namespace selscan::kern::bwd
