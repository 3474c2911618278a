// The roofline micro-benchmark of the selective-scan forward (issue #20): one problem shape (bf16 u, delta, z and
// variable B/C, fp32 A, D and delta_bias, softplus) timed at five levels, each adding one layer of the real call's
// work to the one before, so that a change to the library's kernel can be judged against the floor under it:
//
//   L0 exp      ex2.approx alone, Bt*D*L*N of them on the forward's grid: what the MUFU pipe gives in practice
//   L1 rec      the recurrence h = exp(delta A) h + delta B u, y = sum_n C h on the thread-states mapping
//               (kernels/fwd/ts.cuh: 4 states a thread, tiles of 32 steps, y partials summed through shared memory);
//               delta, delta*u, B and C come from shared-memory tiles written once, one bf16 y per (channel, step)
//               is the only global traffic. Two forms: `plain` (the library's 4-step loop) and `piped` (the
//               exponentials of 16 steps first, then the 16 state chains)
//   L2 onchip   L1 plus every on-chip part of the real call: per tile the staging math (bf16 unpack, softplus of
//               delta + delta_bias, delta*u, the B/C transposes into shared memory) and the epilogue (D u, the SiLU
//               gate, bf16 packing); the raw bf16 inputs sit in registers, one bf16 out_z per (channel, step) leaves
//   L3 staged   L2 plus the real call's global traffic: u, delta, z and the variable B, C (per batch and step) loaded
//               per tile (the next tile's during this one's recurrence), out and out_z stored
//   L4 library  selscan_fwd through the public C ABI on L3's buffers (inference forward: out, out_z, last_state)
//   L3 lane sS  L3's work and traffic on another mapping (N = 16): S states of a channel a lane, B/C rows read by
//               each lane from global memory, warps independent of each other (lane_scan)
//
// and the backward's algorithm (kernels/bwd/ts.cuh) at two levels, N = 16, periodic inputs made in the kernel:
//
//   B1 sweep    per 16-step tile in reverse, the states recomputed from h = 0 (the floor of the sweep alone) and swept
//               backwards: dh, the carry, dA, the du/ddelta sums (bf16 out per channel and step); `sweep` sums dB/dC
//               per thread over the sequence (the constant-B/C form), `red` per (state, step) over the block's 32
//               channels (variable B/C: the per-warp reduction buffer and a float4 atomic per state and 4 steps)
//   B2 passA    B1 red plus the library's pass A: each tile's start state stored in a global workspace by a forward
//               pass first and the recomputation started from it (the true backward of these inputs)
//
// The library's backward on the issue's shapes is selscan_bench's gpu/bwd rows (the same GPU, run beside).
//
// Every level's output is checked against a float64 host computation of the same inputs on sampled channels (every
// step of each), and every output element is checked to be written and finite, so a level that skips work fails
// instead of winning. docs/performance.md ("Roofline micro-benchmark") says how to run it and how to read it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/common/math.cuh"
#include "selscan/selscan.h"

namespace roofline {

using selscan::kern::add_f4;
using selscan::kern::exp2_fast;
using selscan::kern::kLog2e;
using selscan::kern::silu;
using selscan::kern::softplus;

constexpr int kS = 4;             // states per thread, as the library's thread-states forward
constexpr int kTT = 32;           // steps per tile
constexpr int kRow = kTT + 4;     // shared row pitch (floats): float4 rows, conflict-free y-partial stores
constexpr int kV = 8;             // bf16 values per 16-byte vector
constexpr int kVpr = kTT / kV;    // vectors per tile row
constexpr int kMaxThreads = 128;  // threads per block, at most
constexpr int kMinBlocks = 4;     // launch bounds: 128 registers, as the library's variant for the issue's row
constexpr int kPipe = 16;         // steps whose exponentials the piped recurrence computes before the chains
constexpr int kExpChains = 8;     // independent ex2 chains per thread in L0

// ---------------------------------------------------------------------------------------------- inputs
// Every input value is a hash of (tensor, batch, row, step), computed on the host (the reference) and on the device
// (fill kernels, and L1/L2's in-kernel inputs). Values are those of bench/: u and z in +-2, delta in [-3, -1] with
// delta_bias in [-1, 0] through softplus, B and C in +-1, D in [0.5, 1.5], A[d, n] = -(n + 1).
enum Tensor : uint32_t { kTU, kTDelta, kTZ, kTB, kTC, kTD, kTBias, kTDt, kTX0 };

// Values lie on a grid of 2^bits steps over [lo, hi). Every width is a power of two, so each operation of gen_f32 is
// exact and no compiler can change a value (contraction, its own fmaf, folding). The bf16 tensors' grids are coarse
// enough for bf16 to hold every value exactly, so the host reference uses the value itself and never converts
// float -> bf16 -> float: GCC 12 at -O2 was seen to drop such a truncation inside an inlined reference, which then
// misjudged whole rows by 2^-8.
struct Range {
  float lo, hi;
  int bits;
};
__host__ __device__ inline Range range_of(uint32_t tensor) {
  switch (tensor) {
    case kTU: case kTZ: return {-2.f, 2.f, 8};  // steps of 1/64
    case kTDelta: return {-3.f, -1.f, 7};       // steps of 1/64: 8 significant bits up to 3
    case kTB: case kTC: return {-1.f, 1.f, 8};  // steps of 1/128
    case kTD: return {0.5f, 1.5f, 16};
    case kTBias: return {-1.f, 0.f, 16};
    case kTDt: return {0.03125f, 0.28125f, 16};  // L1's delta, already through softplus
    default: return {0.5f, 1.f, 16};             // kTX0: L0's chain seeds
  }
}

__host__ __device__ inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x21f0aaadu;
  x ^= x >> 15;
  x *= 0x735a2d97u;
  x ^= x >> 15;
  return x;
}
__host__ __device__ inline uint32_t hash4(uint32_t tensor, uint32_t b, uint32_t row, uint32_t t) {
  uint32_t x = mix32(tensor * 0x9e3779b1u ^ b * 0x85ebca77u);
  x = mix32(x ^ row * 0xc2b2ae3du);
  return mix32(x ^ t * 0x27d4eb2fu);
}
__host__ __device__ inline float gen_f32(uint32_t tensor, uint32_t b, uint32_t row, uint32_t t) {
  const Range r = range_of(tensor);
  const float k = static_cast<float>(hash4(tensor, b, row, t) >> (32 - r.bits));
  return r.lo + (r.hi - r.lo) * ldexpf(k, -r.bits);
}
__host__ __device__ inline uint32_t f32_bits(float v) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}
__host__ __device__ inline float bits_f32(uint32_t u) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}
// The bf16 bits of a bf16 tensor's value (exact: its low 16 bits are zero; main checks a sample at start-up).
__host__ __device__ inline uint16_t gen_bf16(uint32_t tensor, uint32_t b, uint32_t row, uint32_t t) {
  return static_cast<uint16_t>(f32_bits(gen_f32(tensor, b, row, t)) >> 16);
}
__host__ __device__ inline float bf16_f32(uint16_t bits) { return bits_f32(static_cast<uint32_t>(bits) << 16); }

// ---------------------------------------------------------------------------------------------- device helpers
__device__ __forceinline__ void unpack8(uint4 r, float (&v)[kV]) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  const __nv_bfloat162 p = __floats2bfloat162_rn(lo, hi);  // round to nearest even, as the library's stores
  uint32_t w;
  memcpy(&w, &p, sizeof w);
  return w;
}
__device__ __forceinline__ uint4 pack8(const float (&v)[kV]) {
  return make_uint4(pack2(v[0], v[1]), pack2(v[2], v[3]), pack2(v[4], v[5]), pack2(v[6], v[7]));
}
__device__ __forceinline__ uint4 ldg16(const uint16_t* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ void st16(uint16_t* p, uint4 v) { *reinterpret_cast<uint4*>(p) = v; }
// 8 generated bf16 values of steps t..t+7, packed as a 16-byte load would deliver them.
__device__ __forceinline__ uint4 gen_vec(uint32_t tensor, uint32_t b, uint32_t row, uint32_t t) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = gen_bf16(tensor, b, row, t + 2 * i) | static_cast<uint32_t>(gen_bf16(tensor, b, row, t + 2 * i + 1)) << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}
// Costs no instruction; the compiler must assume v changed here, so L2 cannot hoist its per-tile staging math out of
// the time loop (its raw inputs are the same every tile).
__device__ __forceinline__ void opaque(uint4& v) { asm volatile("" : "+r"(v.x), "+r"(v.y), "+r"(v.z), "+r"(v.w)); }

// ---------------------------------------------------------------------------------------------- kernels
struct Args {
  int64_t batch = 0, dim = 0, len = 0;
  const uint16_t *u = nullptr, *delta = nullptr, *z = nullptr;  // (Bt, D, L) bf16 bits
  const uint16_t *B = nullptr, *C = nullptr;                    // (Bt, N, L) bf16 bits: variable B/C, one group
  const float *A = nullptr, *Dv = nullptr, *bias = nullptr;     // (D, N), (D,), (D,)
  uint16_t *out = nullptr, *out_z = nullptr;                    // (Bt, D, L) bf16 bits
};

enum Level : int { kExp = 0, kRec = 1, kOnChip = 2, kStaged = 3, kLibrary = 4, kBwdSweep = 5, kBwdPassA = 6 };

// One channel's kS states over a tile, 4 steps a pass, as the library's state loop (kernels/fwd/ts.cuh) runs them:
// per step the exponentials, then the chains; B and C of step t + j from bc(t, j, bv, cv), the 4 steps' y partials
// to put_y(t, y).
template <class BcAt, class PutY>
__device__ __forceinline__ void plain_loop(const float* dl_row, const float* du_row, float (&h)[kS],
                                           const float (&a2)[kS], const BcAt& bc, const PutY& put_y) {
#pragma unroll 1
  for (int t = 0; t < kTT; t += 4) {
    const float4 dl4 = *reinterpret_cast<const float4*>(dl_row + t);
    const float4 du4 = *reinterpret_cast<const float4*>(du_row + t);
    const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w};
    const float du[4] = {du4.x, du4.y, du4.z, du4.w};
    float y[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float bv[kS], cv[kS];
      bc(t, j, bv, cv);
      float acc = 0.f;
#pragma unroll
      for (int s = 0; s < kS; ++s) {
        const float a = exp2_fast(dl[j] * a2[s]);
        h[s] = fmaf(a, h[s], bv[s] * du[j]);
        acc = fmaf(h[s], cv[s], acc);
      }
      y[j] = acc;
    }
    put_y(t, y);
  }
}
// put_y for plain_loop: the 4 partials into the thread's own row.
__device__ __forceinline__ auto store_y4(float* y_row) {
  return [y_row](int t, const float (&y)[4]) {
    *reinterpret_cast<float4*>(y_row + t) = make_float4(y[0], y[1], y[2], y[3]);
  };
}

// TT steps of kS states of one channel: a = 2^(delta a2), h = a h + B (delta u), y partial = sum_s C h per step.
// dl_row / du_row: delta and delta*u of the channel; sBk / sCk: the thread's first state of step 0 in [t][N] tiles.
template <int N, bool kPiped, int kC, bool kPack, bool kShfl = false>
__device__ __forceinline__ void recurrence(const float* dl_row, const float* du_row, const float* sBk, const float* sCk,
                                           float* y_row, float (&h)[kC][kS], const float (&a2)[kC][kS]) {
  static_assert(kC == 1 || !kPiped, "the piped form has one channel a thread");
  static_assert(!kPack || (kC == 1 && !kPiped), "the packed B/C tile: one channel, plain loop");
  static_assert(!kShfl || (kPack && N == 16), "the shuffle sum: the packed form, 4 threads a channel");
  if constexpr (kPack) {
    // B and C as raw bf16 in one [t][thread group] tile of 16-byte entries (4 B values, then 4 C values): one
    // shared-memory read per step instead of two, 8 integer ops to widen them.
    const uint4* q4 = reinterpret_cast<const uint4*>(sBk);
    const auto bc_at = [&](int t, int j, float (&bv)[kS], float (&cv)[kS]) {
      float bc[kV];  // B's 4 states, then C's
      unpack8(q4[(t + j) * (N / kS)], bc);
#pragma unroll
      for (int s = 0; s < kS; ++s) bv[s] = bc[s], cv[s] = bc[kS + s];
    };
    if constexpr (kShfl) {
      // The channel's 4 threads sum their partials of these 4 steps by exchanging halves twice (3 shuffles), and
      // each writes one step's whole y: the y traffic through shared memory and the epilogue's reads fall to a
      // quarter. y_row is the channel's row here.
      plain_loop(dl_row, du_row, h[0], a2[0], bc_at, [&](int t, const float (&y)[4]) {
        const int k = static_cast<int>(threadIdx.x) & 3;
        const bool o1 = (k & 1) != 0, o2 = (k & 2) != 0;
        float keep0 = o1 ? y[2] : y[0], keep1 = o1 ? y[3] : y[1];
        const float send0 = o1 ? y[0] : y[2], send1 = o1 ? y[1] : y[3];
        keep0 += __shfl_xor_sync(0xffffffffu, send0, 1);
        keep1 += __shfl_xor_sync(0xffffffffu, send1, 1);
        const float keep = o2 ? keep1 : keep0, send = o2 ? keep0 : keep1;
        y_row[t + (o1 ? 2 : 0) + (o2 ? 1 : 0)] = keep + __shfl_xor_sync(0xffffffffu, send, 2);
      });
    } else {
      plain_loop(dl_row, du_row, h[0], a2[0], bc_at, store_y4(y_row));
    }
  } else if constexpr (kC > 1) {
    // kC channels of the same states: each B/C float4 read from shared memory serves kC * kS updates (the B/C rows
    // are shared by every channel of the group), so the loop's shared-memory wavefronts per update fall.
#pragma unroll 1
    for (int t = 0; t < kTT; t += 4) {
      float dl[kC][4], du[kC][4], y[kC][4];
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        const float4 dl4 = *reinterpret_cast<const float4*>(dl_row + c * kRow + t);
        const float4 du4 = *reinterpret_cast<const float4*>(du_row + c * kRow + t);
        dl[c][0] = dl4.x; dl[c][1] = dl4.y; dl[c][2] = dl4.z; dl[c][3] = dl4.w;
        du[c][0] = du4.x; du[c][1] = du4.y; du[c][2] = du4.z; du[c][3] = du4.w;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 bq = *reinterpret_cast<const float4*>(sBk + (t + j) * N);
        const float4 cq = *reinterpret_cast<const float4*>(sCk + (t + j) * N);
        const float bv[kS] = {bq.x, bq.y, bq.z, bq.w};
        const float cv[kS] = {cq.x, cq.y, cq.z, cq.w};
#pragma unroll
        for (int c = 0; c < kC; ++c) {
          float acc = 0.f;
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            const float a = exp2_fast(dl[c][j] * a2[c][s]);
            h[c][s] = fmaf(a, h[c][s], bv[s] * du[c][j]);
            acc = fmaf(h[c][s], cv[s], acc);
          }
          y[c][j] = acc;
        }
      }
#pragma unroll
      for (int c = 0; c < kC; ++c)
        *reinterpret_cast<float4*>(y_row + c * kRow + t) = make_float4(y[c][0], y[c][1], y[c][2], y[c][3]);
    }
  } else if constexpr (!kPiped) {
    // The library's loop (kernels/fwd/ts.cuh, state_loop()) over float B/C tiles.
    plain_loop(dl_row, du_row, h[0], a2[0], [&](int t, int j, float (&bv)[kS], float (&cv)[kS]) {
      const float4 bq = *reinterpret_cast<const float4*>(sBk + (t + j) * N);
      const float4 cq = *reinterpret_cast<const float4*>(sCk + (t + j) * N);
      bv[0] = bq.x; bv[1] = bq.y; bv[2] = bq.z; bv[3] = bq.w;
      cv[0] = cq.x; cv[1] = cq.y; cv[2] = cq.z; cv[3] = cq.w;
    }, store_y4(y_row));
  } else {
    // The exponentials of kPipe steps first (independent of h: they fill the MUFU pipe back to back), then the
    // chains, whose FMAs no longer wait on a fresh ex2 result.
#pragma unroll 1
    for (int t = 0; t < kTT; t += kPipe) {
      float e[kPipe][kS];
#pragma unroll
      for (int q = 0; q < kPipe; q += 4) {
        const float4 dl4 = *reinterpret_cast<const float4*>(dl_row + t + q);
        const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w};
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
          for (int s = 0; s < kS; ++s) e[q + j][s] = exp2_fast(dl[j] * a2[0][s]);
      }
#pragma unroll
      for (int q = 0; q < kPipe; q += 4) {
        const float4 du4 = *reinterpret_cast<const float4*>(du_row + t + q);
        const float du[4] = {du4.x, du4.y, du4.z, du4.w};
        float y[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 bq = *reinterpret_cast<const float4*>(sBk + (t + q + j) * N);
          const float4 cq = *reinterpret_cast<const float4*>(sCk + (t + q + j) * N);
          const float bv[kS] = {bq.x, bq.y, bq.z, bq.w};
          const float cv[kS] = {cq.x, cq.y, cq.z, cq.w};
          float acc = 0.f;
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            h[0][s] = fmaf(e[q + j][s], h[0][s], bv[s] * du[j]);
            acc = fmaf(h[0][s], cv[s], acc);
          }
          y[j] = acc;
        }
        *reinterpret_cast<float4*>(y_row + t + q) = make_float4(y[0], y[1], y[2], y[3]);
      }
    }
  }
}

// L1, L2 and L3. A block = CH consecutive channels of one batch, TPC = N/4 threads a channel group of kC channels
// (blockDim = CH/kC*TPC). Per tile of kTT steps: [L3: the next tile's loads issued] recurrence -> y partials in shared
// memory; barrier; epilogue (partials summed, [D u, gate], bf16 stores); [L2/L3: the next tile staged]; barrier.
// Shared memory, in floats: delta [CH][kRow], delta*u [CH][kRow], B [kTT][N], C [kTT][N], y partials
// [threads*kC][kRow].
template <int N, int Lv, bool kPiped, int kC = 1, bool kPack = false, bool kShfl = false>
__device__ __forceinline__ void scan_tiles(const Args& a) {
  constexpr int TPC = N / kS;
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  const int tid = static_cast<int>(threadIdx.x);
  const int nthreads = static_cast<int>(blockDim.x);
  const int CH = nthreads / TPC * kC;
  const int64_t tiles_per_batch = a.dim / CH;
  const int64_t b = blockIdx.x / tiles_per_batch;
  const int64_t d0 = (blockIdx.x % tiles_per_batch) * CH;
  float* const sDl = sm;
  float* const sDu = sDl + CH * kRow;
  float* const sB = sDu + CH * kRow;
  float* const sC = sB + kTT * N;
  float* const sY = sC + kTT * N;

  // Recurrence role: states k*kS .. k*kS+3 of channels cc*kC .. cc*kC+kC-1.
  const int cc = tid / TPC, k = tid % TPC;
  float a2[kC][kS], h[kC][kS];
#pragma unroll
  for (int c = 0; c < kC; ++c)
#pragma unroll
    for (int s = 0; s < kS; ++s) {
      a2[c][s] = __ldg(a.A + (d0 + cc * kC + c) * N + k * kS + s) * kLog2e;
      h[c][s] = 0.f;
    }

  // Staging / epilogue role: vectors tid + r*nthreads (r < kC) of the [CH][kTT] channel tiles, each (channel qc[r],
  // steps qt[r]..+7), and vectors tid + i*nthreads (i < kBv) of the [N][kTT] B/C tiles (row qn[i] read as state
  // qn[i], steps qtb[i]..+7): one at N 16 and 32, two at N 64 (128-thread blocks, the host's rule).
  int qc[kC], qt[kC];
  bool vact[kC];
  float Dd[kC], dbias[kC];
  int64_t crow[kC];  // channel qc[r]'s rows of u, delta, z, out, out_z
#pragma unroll
  for (int r = 0; r < kC; ++r) {
    const int qv = tid + r * nthreads;
    qc[r] = qv / kVpr;
    qt[r] = (qv % kVpr) * kV;
    vact[r] = qc[r] < CH;
    const int64_t dq = d0 + (vact[r] ? qc[r] : 0);
    Dd[r] = __ldg(a.Dv + dq);
    dbias[r] = __ldg(a.bias + dq);
    crow[r] = (b * a.dim + dq) * a.len;
  }
  constexpr int kBv = N * kVpr > kMaxThreads ? N * kVpr / kMaxThreads : 1;
  int qn[kBv], qtb[kBv];
  bool bact[kBv];
  int64_t brow[kBv];  // state qn's rows of B and C
  uint4 rB[kBv], rC[kBv];
#pragma unroll
  for (int i = 0; i < kBv; ++i) {
    const int v = tid + i * nthreads;
    qn[i] = v / kVpr;
    qtb[i] = (v % kVpr) * kV;
    bact[i] = qn[i] < N;
    brow[i] = (b * N + (bact[i] ? qn[i] : 0)) * a.len;
    rB[i] = rC[i] = uint4{};
  }
  uint4 ru[kC], rdt[kC], rz[kC], ru_cur[kC];
#pragma unroll
  for (int r = 0; r < kC; ++r) ru[r] = rdt[r] = rz[r] = ru_cur[r] = uint4{};

  const auto prefetch = [&](int64_t t0) {
#pragma unroll
    for (int r = 0; r < kC; ++r)
      if (vact[r]) {
        ru[r] = ldg16(a.u + crow[r] + t0 + qt[r]);
        rdt[r] = ldg16(a.delta + crow[r] + t0 + qt[r]);
      }
#pragma unroll
    for (int i = 0; i < kBv; ++i)
      if (bact[i]) {
        rB[i] = ldg16(a.B + brow[i] + t0 + qtb[i]);
        rC[i] = ldg16(a.C + brow[i] + t0 + qtb[i]);
      }
  };
  const auto stage = [&]() {
#pragma unroll
    for (int r = 0; r < kC; ++r)
      if (vact[r]) {
        float uu[kV], dl[kV], du[kV];
        unpack8(ru[r], uu);
        unpack8(rdt[r], dl);
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          dl[j] = softplus(dl[j] + dbias[r]);
          du[j] = dl[j] * uu[j];
        }
#pragma unroll
        for (int j = 0; j < kV; j += 4) {
          *reinterpret_cast<float4*>(sDl + qc[r] * kRow + qt[r] + j) = make_float4(dl[j], dl[j + 1], dl[j + 2], dl[j + 3]);
          *reinterpret_cast<float4*>(sDu + qc[r] * kRow + qt[r] + j) = make_float4(du[j], du[j + 1], du[j + 2], du[j + 3]);
        }
        ru_cur[r] = ru[r];
      }
#pragma unroll
    for (int i = 0; i < kBv; ++i) {
      if (!bact[i]) continue;
      if constexpr (kPack) {
        // entry (t, qn / 4): 4 B values then 4 C values, raw bf16
        uint16_t* const s16 = reinterpret_cast<uint16_t*>(sB);
        const uint32_t wb[4] = {rB[i].x, rB[i].y, rB[i].z, rB[i].w}, wc[4] = {rC[i].x, rC[i].y, rC[i].z, rC[i].w};
#pragma unroll
        for (int j = 0; j < kV; ++j) {
          const int e = ((qtb[i] + j) * (N / kS) + qn[i] / kS) * 8 + qn[i] % kS;
          s16[e] = static_cast<uint16_t>(wb[j / 2] >> (16 * (j % 2)));
          s16[e + 4] = static_cast<uint16_t>(wc[j / 2] >> (16 * (j % 2)));
        }
      } else {
        float v[kV];
        unpack8(rB[i], v);
#pragma unroll
        for (int j = 0; j < kV; ++j) sB[(qtb[i] + j) * N + qn[i]] = v[j];
        unpack8(rC[i], v);
#pragma unroll
        for (int j = 0; j < kV; ++j) sC[(qtb[i] + j) * N + qn[i]] = v[j];
      }
    }
  };

  if constexpr (Lv == kRec) {
    // The tiles every tile reuses: the inputs are periodic in time with period kTT (the reference knows).
    for (int i = tid; i < CH * kTT; i += nthreads) {
      const int c = i / kTT, t = i % kTT;
      const uint32_t dc = static_cast<uint32_t>(d0 + c);
      const float dl = gen_f32(kTDt, static_cast<uint32_t>(b), dc, t);
      sDl[c * kRow + t] = dl;
      sDu[c * kRow + t] = dl * gen_f32(kTU, static_cast<uint32_t>(b), dc, t);
    }
    for (int i = tid; i < N * kTT; i += nthreads) {
      const int n = i / kTT, t = i % kTT;
      sB[t * N + n] = gen_f32(kTB, static_cast<uint32_t>(b), n, t);
      sC[t * N + n] = gen_f32(kTC, static_cast<uint32_t>(b), n, t);
    }
  } else if constexpr (Lv == kOnChip) {
    // The raw bf16 vectors L3 would load, for step t mod kTT: made once, staged anew every tile.
#pragma unroll
    for (int r = 0; r < kC; ++r)
      if (vact[r]) {
        const uint32_t dq = static_cast<uint32_t>(d0 + qc[r]);
        ru[r] = gen_vec(kTU, static_cast<uint32_t>(b), dq, qt[r]);
        rdt[r] = gen_vec(kTDelta, static_cast<uint32_t>(b), dq, qt[r]);
        rz[r] = gen_vec(kTZ, static_cast<uint32_t>(b), dq, qt[r]);
      }
#pragma unroll
    for (int i = 0; i < kBv; ++i)
      if (bact[i]) {
        rB[i] = gen_vec(kTB, static_cast<uint32_t>(b), qn[i], qtb[i]);
        rC[i] = gen_vec(kTC, static_cast<uint32_t>(b), qn[i], qtb[i]);
      }
    stage();
  } else {
    prefetch(0);
    stage();
  }

  const int64_t ntiles = a.len / kTT;
  for (int64_t it = 0; it < ntiles; ++it) {
    const int64_t t0 = it * kTT;
    __syncthreads();  // the staged tile is visible; the previous epilogue is done with the y partials
    if constexpr (Lv == kStaged) {
      if (it + 1 < ntiles) prefetch(t0 + kTT);
#pragma unroll
      for (int r = 0; r < kC; ++r)
        if (vact[r]) rz[r] = ldg16(a.z + crow[r] + t0 + qt[r]);
    } else if constexpr (Lv == kOnChip) {
#pragma unroll
      for (int r = 0; r < kC; ++r) {
        opaque(ru[r]);
        opaque(rdt[r]);
        opaque(rz[r]);
      }
#pragma unroll
      for (int i = 0; i < kBv; ++i) {
        opaque(rB[i]);
        opaque(rC[i]);
      }
    }
    recurrence<N, kPiped, kC, kPack, kShfl>(sDl + cc * kC * kRow, sDu + cc * kC * kRow,
                                            kPack ? sB + k * 4 : sB + k * kS, sC + k * kS,
                                            kShfl ? sY + cc * kRow : sY + tid * kC * kRow, h, a2);
    __syncthreads();  // the y partials are complete; the staged tile is no longer read
#pragma unroll
    for (int r = 0; r < kC; ++r) {
      if (!vact[r]) continue;
      float y[kV];
      if constexpr (Lv == kRec) {
#pragma unroll
        for (int j = 0; j < kV; ++j) y[j] = -0.f;  // -0 + x == x exactly, so the first add folds away (+0 does not)
      } else {
        unpack8(ru_cur[r], y);
#pragma unroll
        for (int j = 0; j < kV; ++j) y[j] *= Dd[r];
      }
      // channel qc's partials: the TPC threads of its group, slot qc % kC of each
      const int grp = qc[r] / kC, slot = qc[r] % kC;
#pragma unroll
      for (int kk = 0; kk < (kShfl ? 1 : TPC); ++kk) {  // kShfl: one row, the whole y
        const float* yr = kShfl ? sY + qc[r] * kRow + qt[r] : sY + ((grp * TPC + kk) * kC + slot) * kRow + qt[r];
#pragma unroll
        for (int j = 0; j < kV; j += 4) {
          const float4 v = *reinterpret_cast<const float4*>(yr + j);
          y[j] += v.x;
          y[j + 1] += v.y;
          y[j + 2] += v.z;
          y[j + 3] += v.w;
        }
      }
      const int64_t o = crow[r] + t0 + qt[r];
      if constexpr (Lv != kOnChip) st16(a.out + o, pack8(y));
      if constexpr (Lv != kRec) {
        float zz[kV];
        unpack8(rz[r], zz);
#pragma unroll
        for (int j = 0; j < kV; ++j) zz[j] = y[j] * silu(zz[j]);
        st16(a.out_z + o, pack8(zz));
      }
    }
    if constexpr (Lv != kRec) {
      if (it + 1 < ntiles) stage();
    }
  }
}

// One kernel name per level and form, so that profiler rows map to levels by name (ncu -k regex:roofline_).
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_rec_plain(const Args a) {
  scan_tiles<N, kRec, false>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_rec_piped(const Args a) {
  scan_tiles<N, kRec, true>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_onchip_plain(const Args a) {
  scan_tiles<N, kOnChip, false>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_onchip_piped(const Args a) {
  scan_tiles<N, kOnChip, true>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_staged_plain(const Args a) {
  scan_tiles<N, kStaged, false>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_staged_piped(const Args a) {
  scan_tiles<N, kStaged, true>(a);
}
// Two channels a thread (recurrence() says why), at 128 registers and at 168 (3 blocks of 128 threads per SM: the
// grid of the issue's row holds 5.8 warps per SM at two channels a thread, so fewer blocks fit no worse).
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_rec_2ch(const Args a) {
  scan_tiles<N, kRec, false, 2>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_staged_2ch_r128(const Args a) {
  scan_tiles<N, kStaged, false, 2>(a);
}
template <int N>
__global__ void __launch_bounds__(kMaxThreads, 3) roofline_staged_2ch_r168(const Args a) {
  scan_tiles<N, kStaged, false, 2>(a);
}
// One channel a thread, B and C kept as raw bf16 in one tile (recurrence() says why).
template <int N>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_staged_bcpack(const Args a) {
  scan_tiles<N, kStaged, false, 1, true>(a);
}
// bcpack with the y partials summed by shuffles (recurrence() says why); 4 threads a channel only.
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_staged_bcshfl(const Args a) {
  scan_tiles<16, kStaged, false, 1, true, true>(a);
}

// ---------------------------------------------------------------------------------------------- the lane mapping
// L3 lane sS (N = 16): the whole call (L3's work and traffic) on another mapping, to see whether more warps and no
// block-wide staging beat the thread-states tiles: kLaneS states of one channel a lane, so a channel takes
// kLaneP = 16/kLaneS lanes and a warp kLaneCpw = 2*kLaneS whole channels. Warps never wait on each other (no block
// barrier): each lane loads its own states' B and C rows straight from global memory (the rows of a batch are
// shared by all its channels, so they come from L1), and per group of kLaneG = 32/kLaneS steps
//   - lane j of a channel stages steps 2j and 2j+1: softplus(delta + bias) and delta*u into the warp's rows;
//   - every lane runs the group's steps for its states, y partials per step in registers;
//   - the partials go through the warp's shared rows and lane j sums steps 2j, 2j+1 over the channel's lanes, adds
//     D u, stores out, gates with SiLU(z) and stores out_z.
// The next group's raw inputs are loaded into registers while this group runs.
template <int kLaneS>
struct LaneShape {
  static constexpr int kP = 16 / kLaneS;        // lanes a channel
  static constexpr int kCpw = 32 / kP;          // channels a warp
  static constexpr int kG = 32 / kLaneS;        // steps a group: kLaneS * kG = 32 updates a lane
  static constexpr int kPitch = kG + 4;         // y-partial rows: 16-byte stores of 8 lanes on distinct bank quads
  static constexpr int kWarps = 4;              // a block: 4 independent warps
  static constexpr int kChannels = kWarps * kCpw;
  static constexpr int kVecs = kLaneS * kG / 8;  // 16-byte vectors of B (and of C) a lane loads per group: 4
};

template <int kLaneS>
__device__ __forceinline__ void lane_scan(const Args& a) {
  using Sh = LaneShape<kLaneS>;
  constexpr int P = Sh::kP, G = Sh::kG, kVecs = Sh::kVecs;
  __shared__ __align__(16) float sDl[Sh::kWarps][Sh::kCpw * G];
  __shared__ __align__(16) float sDu[Sh::kWarps][Sh::kCpw * G];
  __shared__ __align__(16) float sY[Sh::kWarps][32 * Sh::kPitch];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int c = lane / P, j = lane % P;
  const int64_t tiles_per_batch = a.dim / Sh::kChannels;
  const int64_t b = blockIdx.x / tiles_per_batch;
  const int64_t d = (blockIdx.x % tiles_per_batch) * Sh::kChannels + warp * Sh::kCpw + c;
  const int64_t crow = (b * a.dim + d) * a.len + 2 * j;  // this lane's two steps of the channel's rows
  const float Dd = __ldg(a.Dv + d), dbias = __ldg(a.bias + d);
  float a2[kLaneS], h[kLaneS];
  const uint16_t* brow[kLaneS];
  const uint16_t* cro[kLaneS];
#pragma unroll
  for (int k = 0; k < kLaneS; ++k) {
    a2[k] = __ldg(a.A + d * 16 + j * kLaneS + k) * kLog2e;
    h[k] = 0.f;
    brow[k] = a.B + (b * 16 + j * kLaneS + k) * a.len;
    cro[k] = a.C + (b * 16 + j * kLaneS + k) * a.len;
  }
  float* const dl_w = sDl[warp] + c * G;
  float* const du_w = sDu[warp] + c * G;
  float* const y_w = sY[warp];

  // raw inputs of a group: u, delta, z of steps 2j, 2j+1 (bf16 pairs); B and C of the lane's states, all G steps
  uint32_t ru, rd, rz;
  uint4 rb[kVecs], rc[kVecs];
  const auto load = [&](int64_t t0, uint32_t& u2, uint32_t& d2, uint32_t& z2, uint4 (&bv)[kVecs], uint4 (&cv)[kVecs]) {
    u2 = __ldg(reinterpret_cast<const uint32_t*>(a.u + crow + t0));
    d2 = __ldg(reinterpret_cast<const uint32_t*>(a.delta + crow + t0));
    z2 = __ldg(reinterpret_cast<const uint32_t*>(a.z + crow + t0));
#pragma unroll
    for (int v = 0; v < kVecs; ++v) {
      const int k = v / (G / 8), s = (v % (G / 8)) * 8;
      bv[v] = ldg16(brow[k] + t0 + s);
      cv[v] = ldg16(cro[k] + t0 + s);
    }
  };
  load(0, ru, rd, rz, rb, rc);
  const int64_t ngroups = a.len / G;
  for (int64_t g = 0; g < ngroups; ++g) {
    const int64_t t0 = g * G;
    __syncwarp();  // the previous group's reads of the delta rows and the y partials are done
    const float u0 = __uint_as_float(ru << 16), u1 = __uint_as_float(ru & 0xffff0000u);
    const float dl0 = softplus(__uint_as_float(rd << 16) + dbias), dl1 = softplus(__uint_as_float(rd & 0xffff0000u) + dbias);
    *reinterpret_cast<float2*>(dl_w + 2 * j) = make_float2(dl0, dl1);
    *reinterpret_cast<float2*>(du_w + 2 * j) = make_float2(dl0 * u0, dl1 * u1);
    const uint32_t zc = rz;
    uint4 cb[kVecs], cc[kVecs];
#pragma unroll
    for (int v = 0; v < kVecs; ++v) cb[v] = rb[v], cc[v] = rc[v];
    if (g + 1 < ngroups) load(t0 + G, ru, rd, rz, rb, rc);
    __syncwarp();  // the group's delta rows are written
    float y[G];
#pragma unroll
    for (int s4 = 0; s4 < G; s4 += 4) {
      const float4 dl4 = *reinterpret_cast<const float4*>(dl_w + s4);
      const float4 du4 = *reinterpret_cast<const float4*>(du_w + s4);
      const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const int s = s4 + q;
#pragma unroll
        for (int k = 0; k < kLaneS; ++k) {
          const int e = k * G + s;  // element of the lane's B/C vectors
          const uint4 wb = cb[e / 8], wc = cc[e / 8];
          const uint32_t ub = (e % 8) / 2 == 0 ? wb.x : (e % 8) / 2 == 1 ? wb.y : (e % 8) / 2 == 2 ? wb.z : wb.w;
          const uint32_t uc = (e % 8) / 2 == 0 ? wc.x : (e % 8) / 2 == 1 ? wc.y : (e % 8) / 2 == 2 ? wc.z : wc.w;
          const float bv = __uint_as_float(e % 2 ? ub & 0xffff0000u : ub << 16);
          const float cv = __uint_as_float(e % 2 ? uc & 0xffff0000u : uc << 16);
          const float av = exp2_fast(dl[q] * a2[k]);
          h[k] = fmaf(av, h[k], du[q] * bv);
          y[s] = k == 0 ? h[k] * cv : fmaf(h[k], cv, y[s]);
        }
      }
    }
#pragma unroll
    for (int s = 0; s < G; s += 4)
      *reinterpret_cast<float4*>(y_w + lane * Sh::kPitch + s) = make_float4(y[s], y[s + 1], y[s + 2], y[s + 3]);
    __syncwarp();  // the partials are written
    float y0 = Dd * u0, y1 = Dd * u1;
#pragma unroll
    for (int k = 0; k < P; ++k) {
      const float2 p = *reinterpret_cast<const float2*>(y_w + (c * P + k) * Sh::kPitch + 2 * j);
      y0 += p.x;
      y1 += p.y;
    }
    const int64_t o = crow + t0;
    *reinterpret_cast<uint32_t*>(a.out + o) = pack2(y0, y1);
    const float z0 = __uint_as_float(zc << 16), z1 = __uint_as_float(zc & 0xffff0000u);
    *reinterpret_cast<uint32_t*>(a.out_z + o) = pack2(y0 * silu(z0), y1 * silu(z1));
  }
}
// One kernel name per form (the profile's rows map to levels by name); 128 registers at most, as L3's.
__global__ void __launch_bounds__(128, kMinBlocks) roofline_lane_s1(const Args a) { lane_scan<1>(a); }
__global__ void __launch_bounds__(128, kMinBlocks) roofline_lane_s2(const Args a) { lane_scan<2>(a); }
__global__ void __launch_bounds__(128, kMinBlocks) roofline_lane_s4(const Args a) { lane_scan<4>(a); }

// ---------------------------------------------------------------------------------------------- backward levels
// The thread-states backward's algorithm (kernels/bwd/ts.cuh) without the library's generality, on periodic inputs
// made in the kernel (period kBwdTT in time, as L1's): a block = kBwdCh channels of one batch (lane = channel) x 4
// warps (warp k = states 4k..4k+3), N = 16. Tiles of kBwdTT steps in reverse: recompute the tile's states from its
// start (kept in registers, kBwdTT x kS), then sweep it backwards: dh = dout C + g, g = a dh carried to the step
// before, dA += delta dh a h(t-1), the du/ddelta sums over the thread's states per step (gu = sum dh B, aq = sum
// A log2e dh a h(t-1)) to shared rows that the tile's epilogue sums over the 4 warps and stores (bf16); dB and dC per
// (state, step) summed over the block's 32 channels every 4 steps through a per-warp buffer, then one float4 atomic
// per (state, 4 steps) into fp32 images (kRed), or (!kRed, the constant-B/C form) summed per thread over the whole
// sequence and stored per (channel, state) at the end.
// The sweep is written out here as in the library on purpose: calling the library's code would change the code it
// measures (its staging, conversions and general-purpose paths are what B2 against the library's time shows).
//   kPassA  false: every tile's recomputation starts from h = 0 (the tile-start states are not known: the floor of
//                  the sweep alone); true: a first pass over the tiles stores each tile's start state in a global
//                  workspace, as the library's pass A does, and the recomputation starts from it (the true backward).
constexpr int kBwdCh = 32;          // channels a block
constexpr int kBwdTT = 16;          // steps a tile
constexpr int kBwdRow = kBwdTT + 4;  // padded channel row (floats)
constexpr int kBwdRedRow = 36;      // the reduction buffer's rows: 32 lanes + 4 floats, so a quarter-warp's 16-byte
                                    // reads of 8 different rows fall on 8 different bank quads
constexpr int kBwdThreads = kBwdCh * 4;
// Shared memory in floats: dl, du, dt [ch][row]; B, C [t][16]; gu, aq [warp][ch][row]; the reduction buffer
// [warp][4 steps][8 values][row]; the tile's dB, dC sums [16][t].
constexpr int kBwdSmemFloats = 3 * kBwdCh * kBwdRow + 2 * kBwdTT * 16 + 2 * 4 * kBwdCh * kBwdRow +
                               4 * 4 * 8 * kBwdRedRow + 2 * 16 * kBwdTT;

struct BwdArgs {
  int64_t batch = 0, dim = 0, len = 0;
  const float* A = nullptr;         // (D, 16)
  uint16_t *gu = nullptr, *aq = nullptr;  // (Bt, D, L) bf16: sum_n dh B and sum_n A log2e dh a h(t-1) per step
  float *dB = nullptr, *dC = nullptr;     // kRed: (Bt, 16, L) fp32, zeroed before the launch
  float *dBc = nullptr, *dCc = nullptr;   // !kRed: (Bt, D, 16) fp32
  float* dA = nullptr;                    // (Bt, D, 16) fp32
  float4* ck = nullptr;                   // kPassA: [blocks][tiles][threads] tile-start states
};

// Periodic inputs of (batch b, channel d or state n, step t): delta' (after softplus), u, dout, B, C.
__host__ __device__ inline float bwd_dl(uint32_t b, uint32_t d, uint32_t t) { return gen_f32(kTDt, b, d, t % kBwdTT); }
__host__ __device__ inline float bwd_u(uint32_t b, uint32_t d, uint32_t t) { return gen_f32(kTU, b, d, t % kBwdTT); }
__host__ __device__ inline float bwd_dout(uint32_t b, uint32_t d, uint32_t t) { return gen_f32(kTZ, b, d, t % kBwdTT); }
__host__ __device__ inline float bwd_B(uint32_t b, uint32_t n, uint32_t t) { return gen_f32(kTB, b, n, t % kBwdTT); }
__host__ __device__ inline float bwd_C(uint32_t b, uint32_t n, uint32_t t) { return gen_f32(kTC, b, n, t % kBwdTT); }

template <bool kRed, bool kPassA>
__device__ __forceinline__ void bwd_tiles(const BwdArgs& a) {
  extern __shared__ float4 smem4[];
  float* const sm = reinterpret_cast<float*>(smem4);
  float* const sDl = sm;
  float* const sDu = sDl + kBwdCh * kBwdRow;
  float* const sDt = sDu + kBwdCh * kBwdRow;
  float* const sB = sDt + kBwdCh * kBwdRow;
  float* const sC = sB + kBwdTT * 16;
  float* const sGu = sC + kBwdTT * 16;
  float* const sAq = sGu + 4 * kBwdCh * kBwdRow;
  float* const sRed = sAq + 4 * kBwdCh * kBwdRow;
  float* const sDB = sRed + 4 * 4 * 8 * kBwdRedRow;
  float* const sDC = sDB + 16 * kBwdTT;
  const int tid = static_cast<int>(threadIdx.x), lane = tid & 31, k = tid >> 5;
  const int64_t tiles_per_batch = a.dim / kBwdCh;
  const int64_t b = blockIdx.x / tiles_per_batch;
  const int64_t d0 = (blockIdx.x % tiles_per_batch) * kBwdCh, d = d0 + lane;
  const uint32_t ub = static_cast<uint32_t>(b);
  for (int i = tid; i < kBwdCh * kBwdTT; i += kBwdThreads) {
    const int c = i / kBwdTT, t = i % kBwdTT;
    const uint32_t dc = static_cast<uint32_t>(d0 + c);
    const float dl = bwd_dl(ub, dc, t);
    sDl[c * kBwdRow + t] = dl;
    sDu[c * kBwdRow + t] = dl * bwd_u(ub, dc, t);
    sDt[c * kBwdRow + t] = bwd_dout(ub, dc, t);
  }
  for (int i = tid; i < 16 * kBwdTT; i += kBwdThreads) {
    const int n = i / kBwdTT, t = i % kBwdTT;
    sB[t * 16 + n] = bwd_B(ub, n, t);
    sC[t * 16 + n] = bwd_C(ub, n, t);
  }
  float a2[kS], gc[kS], dA[kS], aB[kS], aC[kS];
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    a2[s] = __ldg(a.A + d * 16 + k * kS + s) * kLog2e;
    gc[s] = dA[s] = aB[s] = aC[s] = 0.f;
  }
  __syncthreads();
  const float* const dl_row = sDl + lane * kBwdRow;
  const float* const du_row = sDu + lane * kBwdRow;
  const float* const dt_row = sDt + lane * kBwdRow;
  const int64_t nt = a.len / kBwdTT;
  float4* const myck = kPassA ? a.ck + static_cast<int64_t>(blockIdx.x) * nt * kBwdThreads + tid : nullptr;
  // One tile forward from h (4 steps' delta' and delta'u a read, as the library's loops), keeping every step's
  // states in hs when given.
  const auto advance = [&](float (&h)[kS], float (*hs)[kS]) {
#pragma unroll
    for (int j4 = 0; j4 < kBwdTT; j4 += 4) {
      const float4 dl4 = *reinterpret_cast<const float4*>(dl_row + j4);
      const float4 du4 = *reinterpret_cast<const float4*>(du_row + j4);
      const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const float4 bq = *reinterpret_cast<const float4*>(sB + (j4 + jj) * 16 + k * kS);
        const float bv[kS] = {bq.x, bq.y, bq.z, bq.w};
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          h[s] = fmaf(exp2_fast(dl[jj] * a2[s]), h[s], bv[s] * du[jj]);
          if (hs != nullptr) hs[j4 + jj][s] = h[s];
        }
      }
    }
  };
  if constexpr (kPassA) {
    float h[kS] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t i = 0; i < nt; ++i) {
      myck[i * kBwdThreads] = make_float4(h[0], h[1], h[2], h[3]);
      advance(h, nullptr);
    }
  }
  for (int64_t i = nt - 1; i >= 0; --i) {
    const int64_t t0 = i * kBwdTT;
    float h0[kS] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (kPassA) {
      const float4 q = myck[i * kBwdThreads];
      h0[0] = q.x; h0[1] = q.y; h0[2] = q.z; h0[3] = q.w;
    }
    float hs[kBwdTT][kS];
    {
      float h[kS] = {h0[0], h0[1], h0[2], h0[3]};
      advance(h, hs);
    }
#pragma unroll
    for (int j4 = kBwdTT - 4; j4 >= 0; j4 -= 4) {
      const float4 dl4 = *reinterpret_cast<const float4*>(dl_row + j4);
      const float4 du4 = *reinterpret_cast<const float4*>(du_row + j4);
      const float4 dt4 = *reinterpret_cast<const float4*>(dt_row + j4);
      const float dl[4] = {dl4.x, dl4.y, dl4.z, dl4.w}, du[4] = {du4.x, du4.y, du4.z, du4.w};
      const float dt[4] = {dt4.x, dt4.y, dt4.z, dt4.w};
      float gu4[4], aq4[4];
#pragma unroll
      for (int jj = 3; jj >= 0; --jj) {
        const int j = j4 + jj;
        const float4 bq = *reinterpret_cast<const float4*>(sB + j * 16 + k * kS);
        const float4 cq = *reinterpret_cast<const float4*>(sC + j * 16 + k * kS);
        const float bv[kS] = {bq.x, bq.y, bq.z, bq.w}, cv[kS] = {cq.x, cq.y, cq.z, cq.w};
        float gu = 0.f, aq = 0.f, vals[8];
#pragma unroll
        for (int s = 0; s < kS; ++s) {
          const float e = exp2_fast(dl[jj] * a2[s]);
          const float dh = fmaf(dt[jj], cv[s], gc[s]);
          gc[s] = e * dh;
          const float q = gc[s] * (j > 0 ? hs[j - 1][s] : h0[s]);
          dA[s] = fmaf(dl[jj], q, dA[s]);
          aq = fmaf(a2[s], q, aq);
          gu = fmaf(dh, bv[s], gu);
          vals[s] = dh * du[jj];
          vals[4 + s] = dt[jj] * hs[j][s];
        }
        gu4[jj] = gu;
        aq4[jj] = aq;
        if constexpr (kRed) {
          float* const slot = sRed + (k * 4 + (j & 3)) * 8 * kBwdRedRow;
#pragma unroll
          for (int v = 0; v < 8; ++v) slot[v * kBwdRedRow + lane] = vals[v];
          if ((j & 3) == 0) {
            // output (step j + tt, value v) of lane tt * 8 + v: its row of 32 channels, four chains
            __syncwarp();
            const int tt = lane >> 3, v = lane & 7;
            const float* const row = sRed + ((k * 4 + tt) * 8 + v) * kBwdRedRow;
            float s4[4];
#pragma unroll
            for (int c = 0; c < 4; ++c) {
              const float4 x = *reinterpret_cast<const float4*>(row + 4 * c);
              s4[c] = (x.x + x.y) + (x.z + x.w);
            }
#pragma unroll
            for (int c = 4; c < 8; ++c) {
              const float4 x = *reinterpret_cast<const float4*>(row + 4 * c);
              s4[c & 3] += (x.x + x.y) + (x.z + x.w);
            }
            (v < 4 ? sDB : sDC)[(k * kS + (v & 3)) * kBwdTT + j + tt] = (s4[0] + s4[1]) + (s4[2] + s4[3]);
            __syncwarp();
          }
        } else {
#pragma unroll
          for (int s = 0; s < kS; ++s) {
            aB[s] += vals[s];
            aC[s] += vals[4 + s];
          }
        }
      }
      *reinterpret_cast<float4*>(sGu + (k * kBwdCh + lane) * kBwdRow + j4) = make_float4(gu4[0], gu4[1], gu4[2], gu4[3]);
      *reinterpret_cast<float4*>(sAq + (k * kBwdCh + lane) * kBwdRow + j4) = make_float4(aq4[0], aq4[1], aq4[2], aq4[3]);
    }
    __syncthreads();  // every warp's gu/aq rows and the tile's dB/dC sums are in shared memory
    {
      // epilogue item tid: channel c, steps 4q..4q+3
      const int c = tid >> 2, q = tid & 3;
      float g[4] = {0.f, 0.f, 0.f, 0.f}, r[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const float4 x = *reinterpret_cast<const float4*>(sGu + (kk * kBwdCh + c) * kBwdRow + 4 * q);
        const float4 y = *reinterpret_cast<const float4*>(sAq + (kk * kBwdCh + c) * kBwdRow + 4 * q);
        g[0] += x.x; g[1] += x.y; g[2] += x.z; g[3] += x.w;
        r[0] += y.x; r[1] += y.y; r[2] += y.z; r[3] += y.w;
      }
      const int64_t o = (b * a.dim + d0 + c) * a.len + t0 + 4 * q;
      *reinterpret_cast<uint2*>(a.gu + o) = make_uint2(pack2(g[0], g[1]), pack2(g[2], g[3]));
      *reinterpret_cast<uint2*>(a.aq + o) = make_uint2(pack2(r[0], r[1]), pack2(r[2], r[3]));
      if constexpr (kRed) {
        // dB/dC item tid: state n, B or C, steps 4q..4q+3
        const int n = tid >> 3, isC = (tid >> 2) & 1;
        const float4 v = *reinterpret_cast<const float4*>((isC ? sDC : sDB) + n * kBwdTT + 4 * q);
        add_f4((isC ? a.dC : a.dB) + (b * 16 + n) * a.len + t0 + 4 * q, v);
      }
    }
    __syncthreads();  // the next tile's sweep rewrites the rows the epilogue read
  }
#pragma unroll
  for (int s = 0; s < kS; ++s) {
    const int64_t o = (b * a.dim + d) * 16 + k * kS + s;
    a.dA[o] = dA[s];
    if constexpr (!kRed) {
      a.dBc[o] = aB[s];
      a.dCc[o] = aC[s];
    }
  }
}

// 3 blocks of 128 threads per SM (168 registers), as the library's thread-states backward.
__global__ void __launch_bounds__(kBwdThreads, 3) roofline_bwd_sweep(const BwdArgs a) { bwd_tiles<false, false>(a); }
__global__ void __launch_bounds__(kBwdThreads, 3) roofline_bwd_red(const BwdArgs a) { bwd_tiles<true, false>(a); }
__global__ void __launch_bounds__(kBwdThreads, 3) roofline_bwd_passa(const BwdArgs a) { bwd_tiles<true, true>(a); }

// L0: kExpChains chains x <- 2^-x per thread (x stays in [0.5, 1]: no denormal, no overflow), each result also
// summed, so the output depends on every one of the `iters` * kExpChains exponentials.
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) roofline_exp(float* out, int64_t iters) {
  const int64_t gid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  float x[kExpChains], s[kExpChains];
#pragma unroll
  for (int c = 0; c < kExpChains; ++c) {
    x[c] = gen_f32(kTX0, 0, static_cast<uint32_t>(gid), c);
    s[c] = 0.f;
  }
#pragma unroll 4
  for (int64_t i = 0; i < iters; ++i) {
#pragma unroll
    for (int c = 0; c < kExpChains; ++c) {
      x[c] = exp2_fast(-x[c]);
      s[c] += x[c];
    }
  }
  float tot = 0.f;
#pragma unroll
  for (int c = 0; c < kExpChains; ++c) tot += s[c];
  out[gid] = tot;
}

// Helpers outside the timed spans (their names do not match the profiler filter).
__global__ void fill_bf16(uint16_t* dst, uint32_t tensor, int64_t rows, int64_t len, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i % len, r = (i / len) % rows, b = i / (len * rows);
    dst[i] = gen_bf16(tensor, static_cast<uint32_t>(b), static_cast<uint32_t>(r), static_cast<uint32_t>(t));
  }
}
// Elements whose exponent bits are all ones: NaN (the 0xFF poison of unwritten outputs) or infinite.
__global__ void count_bad_bf16(const uint16_t* p, int64_t n, unsigned long long* bad) {
  unsigned long long mine = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    mine += (p[i] & 0x7f80u) == 0x7f80u;
  if (mine) atomicAdd(bad, mine);
}
// Holds the stream for `cycles` SM clocks, so that the host enqueues every timed launch before the first one runs.
__global__ void stream_hold(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

}  // namespace roofline

// ==================================================================================================== host
namespace {

using namespace roofline;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "selscan_roofline: %s\n", msg.c_str());
  std::exit(2);
}
void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) die(std::string(what) + ": " + cudaGetErrorString(e));
}

struct Shape {
  int64_t batch = 8, dim = 1536, len = 2048, dstate = 16;
  double updates() const { return double(batch) * double(dim) * double(len) * double(dstate); }
  int64_t btl() const { return batch * dim * len; }
  int64_t bnl() const { return batch * dstate * len; }
};

struct Options {
  Shape shape;
  int reps = 30, warmup = 10, device = 0, threads = 0;  // threads 0: the library's rule
  std::set<int> levels = {0, 1, 2, 3, 4, 5, 6};
  bool profile = false;
  std::string json, ncu_csv, shape_text = "8x1536x2048:16";
};

const char* const kNcuMetrics =
    "smsp__inst_executed.sum,smsp__inst_executed_pipe_xu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,"
    "sm__cycles_elapsed.avg,dram__bytes.sum,gpu__time_duration.sum";
const char* const kNcuFilter = "regex:roofline_|fwd_ts_kernel|fwd_warp_kernel";

void usage(FILE* f) {
  std::fprintf(f,
               "usage: selscan_roofline [--shape BtxDxL:N] [--reps R] [--warmup W] [--levels 0,1,2,3,4,5,6]\n"
               "                        [--threads 64|128] [--device I] [--json FILE] [--ncu-csv FILE] [--profile]\n"
               "  --shape    problem (default 8x1536x2048:16); N 16, 32 or 64 (64: 128-thread blocks, L1-L3 plain,\n"
               "             piped and bcpack), L a multiple of 32, D of the channels a block holds (threads / (N/4))\n"
               "  --reps     timed launches per level (default 30; the median is reported), --warmup untimed before (10)\n"
               "  --levels   which levels to run (0 exp, 1 recurrence, 2 on-chip, 3 staged, 4 library; backward, N 16\n"
               "             only: 5 sweep, 6 sweep + pass A)\n"
               "  --threads  threads per block (default: 64 when 128 leaves fewer than 4 blocks per SM, as the\n"
               "             library's thread-states forward chooses, else 128)\n"
               "  --json     also write the results as JSON\n"
               "  --ncu-csv  add instructions per state update from a profile of a --profile run, taken with\n"
               "             ncu --csv --print-units base --metrics %s\n"
               "             -k %s --log-file FILE selscan_roofline --profile [--shape ...]\n"
               "  --profile  launch and check every level once, no timing (the run to profile)\n"
               "Exit status: 0 when every level's output matched the reference, 1 when one did not, 2 on bad use.\n",
               kNcuMetrics, kNcuFilter);
}

Options parse(int argc, char** argv) {
  Options o;
  const auto need = [&](int& i, const char* name) -> std::string {
    if (i + 1 >= argc) die(std::string(name) + ": expected a value, got nothing");
    return argv[++i];
  };
  const auto as_int = [](const std::string& v, const char* name, long lo, long hi) {
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || x < lo || x > hi)
      die(std::string(name) + ": expected an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
          "], got '" + v + "'");
    return x;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(stdout);
      std::exit(0);
    } else if (a == "--shape") {
      o.shape_text = need(i, "--shape");
      long long bt = 0, d = 0, l = 0, n = 0;
      char tail = 0;
      if (std::sscanf(o.shape_text.c_str(), "%lldx%lldx%lld:%lld%c", &bt, &d, &l, &n, &tail) != 4 || bt < 1 ||
          d < 1 || l < 1 || n < 1)
        die("--shape: expected BtxDxL:N with positive sizes (e.g. 8x1536x2048:16), got '" + o.shape_text + "'");
      o.shape = {bt, d, l, n};
    } else if (a == "--reps") {
      o.reps = static_cast<int>(as_int(need(i, "--reps"), "--reps", 1, 10000));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(as_int(need(i, "--warmup"), "--warmup", 0, 10000));
    } else if (a == "--threads") {
      o.threads = static_cast<int>(as_int(need(i, "--threads"), "--threads", 64, 128));
      if (o.threads != 64 && o.threads != 128) die("--threads: expected 64 or 128, got " + std::to_string(o.threads));
    } else if (a == "--device") {
      o.device = static_cast<int>(as_int(need(i, "--device"), "--device", 0, 1023));
    } else if (a == "--levels") {
      const std::string v = need(i, "--levels");
      o.levels.clear();
      size_t p = 0;
      while (p <= v.size()) {
        const size_t q = std::min(v.find(',', p), v.size());
        o.levels.insert(static_cast<int>(as_int(v.substr(p, q - p), "--levels", 0, 6)));
        p = q + 1;
      }
    } else if (a == "--json") {
      o.json = need(i, "--json");
    } else if (a == "--ncu-csv") {
      o.ncu_csv = need(i, "--ncu-csv");
    } else if (a == "--profile") {
      o.profile = true;
    } else {
      usage(stderr);
      die("unknown argument '" + a + "'");
    }
  }
  if (o.shape.dstate != 16 && o.shape.dstate != 32 && o.shape.dstate != 64)
    die("--shape: N must be 16, 32 or 64 (4 states a thread, 4, 8 or 16 threads a channel), got " +
        std::to_string(o.shape.dstate));
  if (o.shape.len % kTT != 0)
    die("--shape: L must be a multiple of " + std::to_string(kTT) + " (whole tiles), got " +
        std::to_string(o.shape.len));
  if (o.shape.btl() > (int64_t{1} << 40)) die("--shape: Bt*D*L above 2^40");
  return o;
}

// ---------------------------------------------------------------------------------------------- ncu import
// The per-kernel metrics of an `ncu --csv` log (its details page: one row per kernel launch and metric, columns
// found by their header names). Values may carry thousands separators and, without --print-units base, a unit
// prefix (K, M, G, T); both are undone.
struct NcuKernel {
  std::string name;
  std::map<std::string, double> metric;
};

std::vector<std::string> csv_fields(const std::string& line) {
  std::vector<std::string> f;
  std::string cur;
  bool quoted = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char ch = line[i];
    if (quoted) {
      if (ch == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cur += '"';
        ++i;
      } else if (ch == '"') {
        quoted = false;
      } else {
        cur += ch;
      }
    } else if (ch == '"') {
      quoted = true;
    } else if (ch == ',') {
      f.push_back(cur);
      cur.clear();
    } else if (ch != '\r' && ch != '\n') {
      cur += ch;
    }
  }
  f.push_back(cur);
  return f;
}

double unit_scale(const std::string& unit) {
  if (unit.size() < 2) return 1;
  const std::string base = unit.substr(1);
  if (base != "inst" && base != "cycle" && base != "byte" && base != "second") return 1;
  switch (unit[0]) {
    case 'K': case 'k': return 1e3;
    case 'M': return 1e6;
    case 'G': return 1e9;
    case 'T': return 1e12;
    case 'm': return 1e-3;
    case 'u': return 1e-6;
    case 'n': return 1e-9;
    default: return 1;
  }
}

std::vector<NcuKernel> read_ncu_csv(const std::string& path, std::string* err) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) {
    *err = "--ncu-csv: cannot open '" + path + "'";
    return {};
  }
  std::vector<NcuKernel> out;
  std::map<std::string, size_t> by_id;
  std::vector<std::string> header;
  int c_id = -1, c_name = -1, c_metric = -1, c_unit = -1, c_value = -1;
  char buf[1 << 16];
  while (std::fgets(buf, sizeof buf, f) != nullptr) {
    const std::string line = buf;
    if (line.find("\"Kernel Name\"") != std::string::npos && line.find("\"Metric Name\"") != std::string::npos) {
      header = csv_fields(line);
      for (int i = 0; i < static_cast<int>(header.size()); ++i) {
        if (header[i] == "ID") c_id = i;
        if (header[i] == "Kernel Name") c_name = i;
        if (header[i] == "Metric Name") c_metric = i;
        if (header[i] == "Metric Unit") c_unit = i;
        if (header[i] == "Metric Value") c_value = i;
      }
      continue;
    }
    if (header.empty() || line.empty() || line[0] != '"') continue;
    if (c_id < 0 || c_name < 0 || c_metric < 0 || c_value < 0) {
      *err = "--ncu-csv: '" + path +
             "' has no ID / Kernel Name / Metric Name / Metric Value columns (take it with ncu --csv, without "
             "--page raw)";
      break;
    }
    const std::vector<std::string> v = csv_fields(line);
    const int need = std::max({c_id, c_name, c_metric, c_value, c_unit});
    if (static_cast<int>(v.size()) <= need) continue;
    std::string num;
    for (char ch : v[c_value])
      if (ch != ',') num += ch;
    char* end = nullptr;
    const double x = std::strtod(num.c_str(), &end);
    if (num.empty() || *end != '\0') continue;
    auto it = by_id.find(v[c_id]);
    if (it == by_id.end()) {
      it = by_id.emplace(v[c_id], out.size()).first;
      out.push_back({v[c_name], {}});
    }
    out[it->second].metric[v[c_metric]] = x * (c_unit >= 0 ? unit_scale(v[c_unit]) : 1.0);
  }
  std::fclose(f);
  if (err->empty() && out.empty()) *err = "--ncu-csv: no kernel rows in '" + path + "'";
  return out;
}

// ---------------------------------------------------------------------------------------------- buffers
struct Set {  // one complete, independent set of the call's tensors
  uint16_t *u = nullptr, *delta = nullptr, *z = nullptr, *B = nullptr, *C = nullptr, *out = nullptr,
           *out_z = nullptr;
};

// L4's call on a set's tensors: contiguous (Bt, D, L) u, delta, z, out, out_z and (Bt, N, L) B, C (variable, one
// group), fp32 A (D, N), D and delta_bias (D,), softplus, and the inference forward's last_state (Bt, D, N).
selscan_fwd_args_t fwd_args(const Shape& S, const Set& st, const float* A, const float* D, const float* bias,
                            float* last_state) {
  const auto view = [](const void* p, int32_t dtype, std::vector<int64_t> sizes) {
    selscan_tensor_t t = SELSCAN_TENSOR_INIT;
    t.data = const_cast<void*>(p);
    t.dtype = dtype;
    t.ndim = static_cast<int32_t>(sizes.size());
    int64_t stride = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      t.sizes[i] = sizes[size_t(i)];
      t.strides[i] = stride;
      stride *= sizes[size_t(i)];
    }
    return t;
  };
  const std::vector<int64_t> bdl = {S.batch, S.dim, S.len}, bnl = {S.batch, S.dstate, S.len};
  selscan_fwd_args_t f = SELSCAN_FWD_ARGS_INIT;
  f.u = view(st.u, SELSCAN_DTYPE_BFLOAT16, bdl);
  f.delta = view(st.delta, SELSCAN_DTYPE_BFLOAT16, bdl);
  f.z = view(st.z, SELSCAN_DTYPE_BFLOAT16, bdl);
  f.B = view(st.B, SELSCAN_DTYPE_BFLOAT16, bnl);
  f.C = view(st.C, SELSCAN_DTYPE_BFLOAT16, bnl);
  f.A = view(A, SELSCAN_DTYPE_FLOAT32, {S.dim, S.dstate});
  f.D = view(D, SELSCAN_DTYPE_FLOAT32, {S.dim});
  f.delta_bias = view(bias, SELSCAN_DTYPE_FLOAT32, {S.dim});
  f.delta_softplus = 1;
  f.out = view(st.out, SELSCAN_DTYPE_BFLOAT16, bdl);
  f.out_z = view(st.out_z, SELSCAN_DTYPE_BFLOAT16, bdl);
  f.last_state = view(last_state, SELSCAN_DTYPE_FLOAT32, {S.batch, S.dim, S.dstate});
  return f;
}

struct Device {
  int index = 0, sms = 0, clock_khz = 0, cc_major = 0, cc_minor = 0;
  size_t l2 = 0;
  std::string name;
  double exp_per_s = 0, copy_bytes_per_s = 0;
};

struct LevelDef {
  int level;
  std::string name, kernel, what;
  std::function<void(const Set&, cudaStream_t)> launch;
  bool writes_out, writes_out_z;
  double bytes;
  std::function<void(cudaStream_t)> poison = nullptr;  // the level's own outputs, poisoned before its checked launch
};

struct Result {
  bool ran = false, ok = false;
  std::string check;
  std::vector<double> ms;
  double median = 0, min = 0;
  int ncu_rows = 0;
  std::map<std::string, double> ncu;  // summed over the level's kernels, per launch
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// ---------------------------------------------------------------------------------------------- reference
double softplus_d(double x) { return x > 20.0 ? x : std::log1p(std::exp(x)); }
double silu_d(double z) { return z / (1.0 + std::exp(-z)); }

// Channel (b, d) of level lv in float64: out (y + D u; L1: y) and out_z (y + D u) silu(z) for every step. L1 and L2
// use the periodic in-kernel inputs of step t mod kTT, L3 and L4 the filled tensors.
void reference_row(const Shape& s, int lv, int64_t b, int64_t d, std::vector<double>* out, std::vector<double>* out_z) {
  const int64_t N = s.dstate;
  const uint32_t ub = static_cast<uint32_t>(b), ud = static_cast<uint32_t>(d);
  std::vector<double> h(static_cast<size_t>(N), 0.0);
  out->assign(static_cast<size_t>(s.len), 0.0);
  out_z->assign(static_cast<size_t>(s.len), 0.0);
  const double Dd = gen_f32(kTD, 0, ud, 0), bias = gen_f32(kTBias, 0, ud, 0);
  for (int64_t t = 0; t < s.len; ++t) {
    const uint32_t te = static_cast<uint32_t>(lv <= kOnChip ? t % kTT : t);
    // The bf16 tensors' values are exact in bf16 (range_of), so the generated value is what the kernels read.
    double dl, zz = 0;
    const double uu = gen_f32(kTU, ub, ud, te);
    if (lv == kRec) {
      dl = gen_f32(kTDt, ub, ud, te);
    } else {
      dl = softplus_d(double(gen_f32(kTDelta, ub, ud, te)) + bias);
      zz = gen_f32(kTZ, ub, ud, te);
    }
    double y = 0;
    for (int64_t n = 0; n < N; ++n) {
      const double Bv = gen_f32(kTB, ub, static_cast<uint32_t>(n), te);
      const double Cv = gen_f32(kTC, ub, static_cast<uint32_t>(n), te);
      h[size_t(n)] = std::exp(dl * -double(n + 1)) * h[size_t(n)] + dl * Bv * uu;
      y += Cv * h[size_t(n)];
    }
    if (lv != kRec) y += Dd * uu;
    (*out)[size_t(t)] = y;
    (*out_z)[size_t(t)] = y * silu_d(zz);
  }
}

// max over the values of |got - ref| / (|ref| + rms(ref)), a value that is not finite counting as 1e30.
double rel_err(const std::vector<double>& got, const std::vector<double>& ref) {
  double ss = 0;
  for (double r : ref) ss += r * r;
  const double rms = std::sqrt(ss / double(ref.size())) + 1e-30;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    worst = std::max(worst, std::isfinite(got[i]) ? std::fabs(got[i] - ref[i]) / (std::fabs(ref[i]) + rms) : 1e30);
  return worst;
}
// rel_err of a bf16 row: the bf16 rounding of the outputs alone gives up to 2^-8 (0.004); a wrong or skipped
// computation gives O(1).
constexpr double kTol = 1e-2;
double row_error(const std::vector<uint16_t>& got, const std::vector<double>& ref) {
  std::vector<double> g(got.size());
  for (size_t i = 0; i < got.size(); ++i) g[i] = bf16_f32(got[i]);
  return rel_err(g, ref);
}

// One channel (b, d) of the backward levels in float64 (kernel bwd_tiles' inputs and algorithm; restart: every
// tile's states recomputed from 0, as B1 does): gu and aq per step, dA and the whole-sequence dB/dC sums per state;
// when dB / dC are given ([16][L]), the channel's per-step dB/dC terms are added to them.
struct BwdChannel {
  std::vector<double> gu, aq;
  double dA[16] = {}, dBc[16] = {}, dCc[16] = {};
};
void reference_bwd_channel(const Shape& s, bool restart, int64_t b, int64_t d, BwdChannel* out, double* dB, double* dC) {
  const int64_t L = s.len;
  const uint32_t ub = static_cast<uint32_t>(b), ud = static_cast<uint32_t>(d);
  *out = BwdChannel{};  // the caller reuses one for every channel of a batch: the per-state sums start at 0
  std::vector<double> h(static_cast<size_t>(L) * 16), hp(static_cast<size_t>(L) * 16);  // h(t) and h(t-1) as used
  double cur[16] = {};
  for (int64_t t = 0; t < L; ++t) {
    if (restart && t % kBwdTT == 0) std::fill(cur, cur + 16, 0.0);
    const double dl = bwd_dl(ub, ud, uint32_t(t)), du = dl * double(bwd_u(ub, ud, uint32_t(t)));
    const double e1 = std::exp(-dl);  // exp(delta A_n) = e1^(n+1): one exp a step (the check runs every channel)
    double a = 1;
    for (int n = 0; n < 16; ++n) {
      a *= e1;
      hp[size_t(t * 16 + n)] = cur[n];
      cur[n] = a * cur[n] + double(bwd_B(ub, uint32_t(n), uint32_t(t))) * du;
      h[size_t(t * 16 + n)] = cur[n];
    }
  }
  out->gu.assign(size_t(L), 0.0);
  out->aq.assign(size_t(L), 0.0);
  double g[16] = {};
  for (int64_t t = L - 1; t >= 0; --t) {
    const double dl = bwd_dl(ub, ud, uint32_t(t)), du = dl * double(bwd_u(ub, ud, uint32_t(t)));
    const double dt = bwd_dout(ub, ud, uint32_t(t)), e1 = std::exp(-dl);
    double gu = 0, aq = 0, a = 1;
    for (int n = 0; n < 16; ++n) {
      a *= e1;
      const double dh = dt * double(bwd_C(ub, uint32_t(n), uint32_t(t))) + g[n];
      g[n] = a * dh;
      const double q = g[n] * hp[size_t(t * 16 + n)];
      out->dA[n] += dl * q;
      aq += -double(n + 1) * double(kLog2e) * q;
      gu += dh * double(bwd_B(ub, uint32_t(n), uint32_t(t)));
      const double db = dh * du, dc = dt * h[size_t(t * 16 + n)];
      out->dBc[n] += db;
      out->dCc[n] += dc;
      if (dB != nullptr) {
        dB[n * L + t] += db;
        dC[n * L + t] += dc;
      }
    }
    out->gu[size_t(t)] = gu;
    out->aq[size_t(t)] = aq;
  }
}

std::string fmt(const char* f, double v) {
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      o += ' ';
      continue;
    }
    o += c;
  }
  return o + "\"";
}

}  // namespace

int main(int argc, char** argv) {
  const Options opt = parse(argc, argv);
  const Shape& S = opt.shape;
  for (uint32_t t : {kTU, kTDelta, kTZ, kTB, kTC})
    for (uint32_t i = 0; i < 4096; ++i)
      if ((f32_bits(gen_f32(t, i % 7, i, 13 * i)) & 0xffffu) != 0)
        die("internal: range_of(" + std::to_string(t) + ") makes values bf16 cannot hold exactly; the reference needs them");
  const int N = static_cast<int>(S.dstate), TPC = N / kS;

  // ---- device
  Device dev;
  dev.index = opt.device;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) die("no CUDA device (cudaGetDeviceCount)");
  if (opt.device >= ndev)
    die("--device: " + std::to_string(opt.device) + ", but there are " + std::to_string(ndev) + " device(s)");
  ck(cudaSetDevice(opt.device), "cudaSetDevice");
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, opt.device), "cudaGetDeviceProperties");
  dev.name = prop.name;
  int l2 = 0;
  ck(cudaDeviceGetAttribute(&dev.sms, cudaDevAttrMultiProcessorCount, opt.device), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&dev.clock_khz, cudaDevAttrClockRate, opt.device), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, opt.device), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&dev.cc_major, cudaDevAttrComputeCapabilityMajor, opt.device), "cudaDeviceGetAttribute");
  ck(cudaDeviceGetAttribute(&dev.cc_minor, cudaDevAttrComputeCapabilityMinor, opt.device), "cudaDeviceGetAttribute");
  dev.l2 = static_cast<size_t>(l2);
  dev.exp_per_s = 16.0 * dev.sms * 1e3 * dev.clock_khz;  // MUFU.EX2: 16 per clock per SM (sm_80 .. sm_90)

  // ---- launch shape: the library's rule (src/cuda/select.cpp, fwd_ts_plan) between 128 and 64 threads
  int threads = opt.threads;
  if (threads == 0) {
    threads = kMaxThreads;
    const int64_t blocks128 = S.batch * S.dim / (kMaxThreads / TPC);
    if (blocks128 < int64_t{4} * dev.sms && N * kVpr <= 64) threads = 64;
  }
  const int CH = threads / TPC;
  // The B/C tiles take one 16-byte vector a thread, or at N = 64 two a thread of a 128-thread block (scan_tiles).
  if (N * kVpr > kMaxThreads ? threads != kMaxThreads : N * kVpr > threads)
    die("--threads: " + std::to_string(threads) + " threads cannot stage the B/C tiles of N=" + std::to_string(N) +
        " (" + std::to_string(N * kVpr) + " 16-byte vectors)");
  if (S.dim % CH != 0)
    die("--shape: D must be a multiple of " + std::to_string(CH) + " (the channels of a " + std::to_string(threads) +
        "-thread block at N=" + std::to_string(N) + "), got " + std::to_string(S.dim));
  const int64_t blocks = S.batch * S.dim / CH;
  const size_t smem = sizeof(float) * static_cast<size_t>(2 * CH * kRow + 2 * kTT * N + threads * kRow);

  cudaStream_t stream;
  ck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");

  // ---- memory floor: a device-to-device copy, read + write counted (docs/performance.md, mem_floor_frac)
  size_t free_b = 0, total_b = 0;
  ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (!opt.profile) {
    const size_t cb = std::min<size_t>(size_t{512} << 20, free_b / 4) & ~size_t{4095};
    void *src = nullptr, *dst = nullptr;
    ck(cudaMalloc(&src, cb), "cudaMalloc(copy source)");
    ck(cudaMalloc(&dst, cb), "cudaMalloc(copy destination)");
    ck(cudaMemsetAsync(src, 0x3c, cb, stream), "cudaMemsetAsync");
    cudaEvent_t e0, e1;
    ck(cudaEventCreate(&e0), "cudaEventCreate");
    ck(cudaEventCreate(&e1), "cudaEventCreate");
    std::vector<double> t;
    for (int i = 0; i < 11; ++i) {
      ck(cudaMemcpyAsync(src, dst, cb, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      ck(cudaEventRecord(e0, stream), "cudaEventRecord");
      ck(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
      ck(cudaEventRecord(e1, stream), "cudaEventRecord");
      ck(cudaEventSynchronize(e1), "copy");
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
      if (i > 0) t.push_back(1e-3 * ms);
    }
    dev.copy_bytes_per_s = 2.0 * double(cb) / median(t);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaFree(src);
    cudaFree(dst);
  }

  // ---- buffers: independent sets rotating over >= 200 MB (> 3x an H200's L2), at least 3
  const size_t btl_bytes = sizeof(uint16_t) * static_cast<size_t>(S.btl());
  const size_t bnl_bytes = sizeof(uint16_t) * static_cast<size_t>(S.bnl());
  const size_t set_bytes = 5 * btl_bytes + 2 * bnl_bytes;
  ck(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  int nsets = opt.profile ? 1 : std::max<int>(3, static_cast<int>(std::ceil(200e6 / double(set_bytes))));
  nsets = std::min<int>(nsets, 64);
  while (nsets > 1 && double(nsets) * double(set_bytes) > 0.8 * double(free_b)) --nsets;
  if (double(set_bytes) > 0.8 * double(free_b))
    die("--shape: one buffer set needs " + fmt("%.0f", set_bytes * 1e-6) + " MB, the device has " +
        fmt("%.0f", free_b * 1e-6) + " MB free");
  std::vector<Set> sets(static_cast<size_t>(nsets));
  const auto fill = [&](uint16_t* p, uint32_t tensor, int64_t rows) {
    const int64_t n = S.batch * rows * S.len;
    fill_bf16<<<4 * dev.sms, 256, 0, stream>>>(p, tensor, rows, S.len, n);
    ck(cudaGetLastError(), "fill_bf16");
  };
  for (Set& st : sets) {
    for (uint16_t** p : {&st.u, &st.delta, &st.z, &st.out, &st.out_z})
      ck(cudaMalloc(reinterpret_cast<void**>(p), btl_bytes), "cudaMalloc(set)");
    for (uint16_t** p : {&st.B, &st.C}) ck(cudaMalloc(reinterpret_cast<void**>(p), bnl_bytes), "cudaMalloc(set)");
    fill(st.u, kTU, S.dim);
    fill(st.delta, kTDelta, S.dim);
    fill(st.z, kTZ, S.dim);
    fill(st.B, kTB, S.dstate);
    fill(st.C, kTC, S.dstate);
  }
  std::vector<float> hA(static_cast<size_t>(S.dim * N)), hD(static_cast<size_t>(S.dim)), hBias(hD.size());
  for (int64_t d = 0; d < S.dim; ++d) {
    for (int n = 0; n < N; ++n) hA[size_t(d * N + n)] = -float(n + 1);
    hD[size_t(d)] = gen_f32(kTD, 0, static_cast<uint32_t>(d), 0);
    hBias[size_t(d)] = gen_f32(kTBias, 0, static_cast<uint32_t>(d), 0);
  }
  float *dA = nullptr, *dD = nullptr, *dBias = nullptr, *dLast = nullptr, *dExp = nullptr;
  unsigned long long* dBad = nullptr;
  ck(cudaMalloc(&dA, hA.size() * sizeof(float)), "cudaMalloc(A)");
  ck(cudaMalloc(&dD, hD.size() * sizeof(float)), "cudaMalloc(D)");
  ck(cudaMalloc(&dBias, hBias.size() * sizeof(float)), "cudaMalloc(delta_bias)");
  ck(cudaMalloc(&dLast, sizeof(float) * size_t(S.batch * S.dim * N)), "cudaMalloc(last_state)");
  ck(cudaMalloc(&dExp, sizeof(float) * size_t(blocks * threads)), "cudaMalloc(exp out)");
  ck(cudaMalloc(&dBad, sizeof *dBad), "cudaMalloc(counter)");
  ck(cudaMemcpy(dA, hA.data(), hA.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy(A)");
  ck(cudaMemcpy(dD, hD.data(), hD.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy(D)");
  ck(cudaMemcpy(dBias, hBias.data(), hBias.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy(bias)");
  ck(cudaStreamSynchronize(stream), "filling the inputs");

  // ---- the library call (L4) on a set's buffers
  selscan_exec_t exec = SELSCAN_EXEC_INIT;
  exec.device_kind = SELSCAN_DEVICE_CUDA;
  exec.device_index = opt.device;
  exec.stream = stream;
  void* workspace = nullptr;
  std::string lib_problem;
  if (opt.levels.count(kLibrary)) {
    const selscan_status_t chk = selscan_check_device(opt.device);
    size_t ws = 0;
    const selscan_fwd_args_t f = fwd_args(S, sets[0], dA, dD, dBias, dLast);
    if (chk != SELSCAN_STATUS_SUCCESS) {
      lib_problem = std::string("selscan_check_device: ") + selscan_status_string(chk) + ": " + selscan_last_error();
    } else if (const selscan_status_t s = selscan_fwd_workspace_size(&f, &exec, &ws); s != SELSCAN_STATUS_SUCCESS) {
      lib_problem = std::string("selscan_fwd_workspace_size: ") + selscan_status_string(s) + ": " + selscan_last_error();
    } else if (ws > 0) {
      ck(cudaMalloc(&workspace, ws), "cudaMalloc(workspace)");
      exec.workspace = workspace;
      exec.workspace_bytes = ws;
    }
  }

  // ---- the levels
  const double U = S.updates();
  const double io_bytes = 2.0 * double(S.btl());  // one bf16 tensor of (Bt, D, L)
  const double params = 4.0 * double(S.dim) * double(N + 2);
  const double staged_bytes = 5 * io_bytes + 2 * 2.0 * double(S.bnl()) + params;
  Args base;
  base.batch = S.batch;
  base.dim = S.dim;
  base.len = S.len;
  base.A = dA;
  base.Dv = dD;
  base.bias = dBias;
  const auto args_of = [&](const Set& st) {
    Args a = base;
    a.u = st.u; a.delta = st.delta; a.z = st.z; a.B = st.B; a.C = st.C; a.out = st.out; a.out_z = st.out_z;
    return a;
  };
  using Kern = void (*)(const Args);
  // kc channels a thread: the same threads per block, kc times the channels, 1/kc of the blocks.
  const auto tiles = [&](Kern k, int kc = 1) {
    const int64_t nb = blocks / kc;
    const size_t sm = sizeof(float) * static_cast<size_t>(2 * CH * kc * kRow + 2 * kTT * N + threads * kc * kRow);
    if (sm > 48 * 1024)  // above 48 KB a kernel needs the opt-in
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(sm)),
         "cudaFuncSetAttribute(shared memory)");
    return [=, &args_of](const Set& st, cudaStream_t s) {
      k<<<static_cast<unsigned>(nb), threads, sm, s>>>(args_of(st));
    };
  };
  const bool two_ch = N != 64 && S.dim % (2 * CH) == 0;  // the 2ch levels: N 16 and 32
  const bool n16 = N == 16;
  const auto by_n = [N](Kern k16, Kern k32, Kern k64) { return N == 16 ? k16 : N == 32 ? k32 : k64; };
  const int64_t iters = S.len * kS / kExpChains;
  std::vector<LevelDef> defs;
  defs.push_back({kExp, "L0 exp", "roofline_exp",
                  "ex2.approx only: Bt*D*L*N exponentials on the forward's grid, " + std::to_string(kExpChains) +
                      " chains a thread",
                  [=](const Set&, cudaStream_t s) { roofline_exp<<<unsigned(blocks), threads, 0, s>>>(dExp, iters); },
                  false, false, 4.0 * double(blocks * threads)});
  defs.push_back({kRec, "L1 rec plain", "roofline_rec_plain",
                  "recurrence, inputs in shared tiles written once, y out (bf16); the library's 4-step loop",
                  tiles(by_n(roofline_rec_plain<16>, roofline_rec_plain<32>, roofline_rec_plain<64>)),
                  true, false, io_bytes + params});
  defs.push_back({kRec, "L1 rec piped", "roofline_rec_piped",
                  "as L1 plain, the 16 steps' exponentials before their chains",
                  tiles(by_n(roofline_rec_piped<16>, roofline_rec_piped<32>, roofline_rec_piped<64>)),
                  true, false, io_bytes + params});
  defs.push_back({kOnChip, "L2 onchip plain", "roofline_onchip_plain",
                  "L1 + staging math and epilogue (softplus, D u, SiLU gate, bf16), raw inputs in registers, out_z",
                  tiles(by_n(roofline_onchip_plain<16>, roofline_onchip_plain<32>, roofline_onchip_plain<64>)),
                  false, true, io_bytes + params});
  defs.push_back({kOnChip, "L2 onchip piped", "roofline_onchip_piped", "as L2 plain with the piped recurrence",
                  tiles(by_n(roofline_onchip_piped<16>, roofline_onchip_piped<32>, roofline_onchip_piped<64>)),
                  false, true, io_bytes + params});
  defs.push_back({kStaged, "L3 staged plain", "roofline_staged_plain",
                  "L2 + global traffic: u, delta, z, B, C loaded (bf16), out and out_z stored",
                  tiles(by_n(roofline_staged_plain<16>, roofline_staged_plain<32>, roofline_staged_plain<64>)),
                  true, true, staged_bytes});
  defs.push_back({kStaged, "L3 staged piped", "roofline_staged_piped", "as L3 plain with the piped recurrence",
                  tiles(by_n(roofline_staged_piped<16>, roofline_staged_piped<32>, roofline_staged_piped<64>)),
                  true, true, staged_bytes});
  if (two_ch) {
    defs.push_back({kRec, "L1 rec 2ch", "roofline_rec_2ch",
                    "as L1 plain, two channels a thread (half the threads; each B/C read serves 8 updates)",
                    tiles(n16 ? roofline_rec_2ch<16> : roofline_rec_2ch<32>, 2), true, false, io_bytes + params});
    defs.push_back({kStaged, "L3 staged 2ch", "roofline_staged_2ch_r128", "as L3 plain, two channels a thread",
                    tiles(n16 ? roofline_staged_2ch_r128<16> : roofline_staged_2ch_r128<32>, 2), true, true, staged_bytes});
    defs.push_back({kStaged, "L3 2ch r168", "roofline_staged_2ch_r168",
                    "as L3 2ch at up to 168 registers (launch bounds 3 blocks of 128)",
                    tiles(n16 ? roofline_staged_2ch_r168<16> : roofline_staged_2ch_r168<32>, 2), true, true,
                    staged_bytes});
  }
  defs.push_back({kStaged, "L3 bcpack", "roofline_staged_bcpack",
                  "as L3 plain, B and C raw bf16 in one shared tile (one 16-byte read a step)",
                  tiles(by_n(roofline_staged_bcpack<16>, roofline_staged_bcpack<32>, roofline_staged_bcpack<64>)),
                  true, true, staged_bytes});
  if (n16)
    defs.push_back({kStaged, "L3 bcpack shfl", "roofline_staged_bcshfl",
                    "as L3 bcpack, the 4 threads' y partials summed by warp shuffles (one y row a channel)",
                    tiles(roofline_staged_bcshfl), true, true, staged_bytes});
  const auto lanes = [&](Kern k, int per_lane) {
    const int64_t nb = S.batch * S.dim / (8 * per_lane);  // LaneShape<per_lane>::kChannels a block
    return [=, &args_of](const Set& st, cudaStream_t s) { k<<<static_cast<unsigned>(nb), 128, 0, s>>>(args_of(st)); };
  };
  const std::pair<int, Kern> lane_forms[] = {{1, roofline_lane_s1}, {2, roofline_lane_s2}, {4, roofline_lane_s4}};
  for (const auto& [per_lane, k] : lane_forms)
    if (n16 && S.dim % (8 * per_lane) == 0)
      defs.push_back({kStaged, "L3 lane s" + std::to_string(per_lane), "roofline_lane_s" + std::to_string(per_lane),
                      "as L3, " + std::to_string(per_lane) + " state(s) of a channel a lane, B/C rows from L1, no block "
                      "barrier (lane_scan)",
                      lanes(k, per_lane), true, true, staged_bytes});
  defs.push_back({kLibrary, "L4 library", "fwd_ts_kernel|fwd_warp_kernel",
                  "selscan_fwd (C ABI): out, out_z, last_state; the kernel the library chooses",
                  [&](const Set& st, cudaStream_t) {
                    const selscan_fwd_args_t f = fwd_args(S, st, dA, dD, dBias, dLast);
                    const selscan_status_t s = selscan_fwd(&f, &exec);
                    if (s != SELSCAN_STATUS_SUCCESS)
                      die(std::string("selscan_fwd: ") + selscan_status_string(s) + ": " + selscan_last_error());
                  },
                  true, true, staged_bytes + 4.0 * double(S.batch * S.dim * N)});

  // ---- the backward levels: their own outputs (the forward's buffers are not read)
  const bool want_bwd = opt.levels.count(kBwdSweep) || opt.levels.count(kBwdPassA);
  std::string bwd_problem;
  if (N != 16 || S.dim % kBwdCh != 0)
    bwd_problem = "the backward levels need N = 16 and D a multiple of " + std::to_string(kBwdCh);
  const int64_t bwd_blocks = S.batch * S.dim / kBwdCh, bwd_ntiles = S.len / kBwdTT;
  const size_t bwd_smem = sizeof(float) * size_t(kBwdSmemFloats);
  const size_t bdn_bytes = sizeof(float) * size_t(S.batch * S.dim * 16), bnl_f32 = sizeof(float) * size_t(S.bnl());
  BwdArgs bw;
  if (want_bwd && bwd_problem.empty()) {
    bw.batch = S.batch;
    bw.dim = S.dim;
    bw.len = S.len;
    bw.A = dA;
    ck(cudaMalloc(&bw.gu, btl_bytes), "cudaMalloc(bwd gu)");
    ck(cudaMalloc(&bw.aq, btl_bytes), "cudaMalloc(bwd aq)");
    ck(cudaMalloc(&bw.dB, bnl_f32), "cudaMalloc(bwd dB)");
    ck(cudaMalloc(&bw.dC, bnl_f32), "cudaMalloc(bwd dC)");
    ck(cudaMalloc(&bw.dBc, bdn_bytes), "cudaMalloc(bwd dB sums)");
    ck(cudaMalloc(&bw.dCc, bdn_bytes), "cudaMalloc(bwd dC sums)");
    ck(cudaMalloc(&bw.dA, bdn_bytes), "cudaMalloc(bwd dA)");
    if (opt.levels.count(kBwdPassA))
      ck(cudaMalloc(&bw.ck, sizeof(float4) * size_t(bwd_blocks * bwd_ntiles * kBwdThreads)), "cudaMalloc(checkpoints)");
    for (auto k : {roofline_bwd_sweep, roofline_bwd_red, roofline_bwd_passa})
      ck(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bwd_smem)),
         "cudaFuncSetAttribute(backward shared memory)");
  }
  const auto bwd = [&](void (*k)(const BwdArgs), bool red) {
    return [=](const Set&, cudaStream_t s) {
      if (red) {  // the atomically summed images start at 0, as the library's workspace images do
        ck(cudaMemsetAsync(bw.dB, 0, bnl_f32, s), "cudaMemsetAsync(dB)");
        ck(cudaMemsetAsync(bw.dC, 0, bnl_f32, s), "cudaMemsetAsync(dC)");
      }
      k<<<static_cast<unsigned>(bwd_blocks), kBwdThreads, bwd_smem, s>>>(bw);
    };
  };
  const auto bwd_poison = [&](cudaStream_t s) {
    ck(cudaMemsetAsync(bw.gu, 0xff, btl_bytes, s), "cudaMemsetAsync(poison gu)");
    ck(cudaMemsetAsync(bw.aq, 0xff, btl_bytes, s), "cudaMemsetAsync(poison aq)");
    for (float* p : {bw.dBc, bw.dCc, bw.dA}) ck(cudaMemsetAsync(p, 0xff, bdn_bytes, s), "cudaMemsetAsync(poison)");
  };
  // Bytes: gu and aq out (bf16), dB/dC atomics (read and written) or the per-thread sums, dA; pass A: the
  // checkpoints written and read back.
  const double bwd_out = 2 * io_bytes + 3.0 * double(bdn_bytes), bwd_red = 4.0 * double(bnl_f32);
  const double bwd_ck = 2.0 * 16 * double(bwd_blocks * bwd_ntiles * kBwdThreads);
  defs.push_back({kBwdSweep, "B1 bwd sweep", "roofline_bwd_sweep",
                  "backward: per 16-step tile the states recomputed from 0 and swept back (dh, carry, dA, du/ddelta "
                  "sums out as bf16); dB/dC summed per thread (constant-B/C form); inputs made in the kernel",
                  bwd(roofline_bwd_sweep, false), false, false, bwd_out, bwd_poison});
  defs.push_back({kBwdSweep, "B1 bwd red", "roofline_bwd_red",
                  "B1 sweep with variable dB/dC: summed over the block's 32 channels every 4 steps (per-warp buffer), "
                  "a float4 atomic per state and 4 steps",
                  bwd(roofline_bwd_red, true), false, false, bwd_out + bwd_red, bwd_poison});
  defs.push_back({kBwdPassA, "B2 bwd passA", "roofline_bwd_passa",
                  "B1 red + the library's pass A: tile-start states stored by a forward pass, recomputation from them",
                  bwd(roofline_bwd_passa, true), false, false, bwd_out + bwd_red + bwd_ck, bwd_poison});

  // Sampled channels: both ends, block edges, and a few spread by the hash; every step of each.
  std::vector<std::pair<int64_t, int64_t>> samples = {{0, 0},
                                                       {0, CH - 1},
                                                       {0, std::min<int64_t>(CH, S.dim - 1)},
                                                       {S.batch / 2, (S.dim / 2 + 3) % S.dim},
                                                       {S.batch - 1, 0},
                                                       {S.batch - 1, S.dim - 1}};
  for (uint32_t i = 0; i < 4; ++i)
    samples.push_back({int64_t(hash4(99, i, 0, 0) % uint64_t(S.batch)), int64_t(hash4(99, i, 1, 0) % uint64_t(S.dim))});
  std::sort(samples.begin(), samples.end());
  samples.erase(std::unique(samples.begin(), samples.end()), samples.end());

  // Elements of a (Bt, D, L) bf16 output still the NaN poison or not finite.
  const auto count_bad = [&](const uint16_t* p) {
    ck(cudaMemsetAsync(dBad, 0, sizeof *dBad, stream), "cudaMemsetAsync");
    count_bad_bf16<<<4 * dev.sms, 256, 0, stream>>>(p, S.btl(), dBad);
    unsigned long long bad = 0;
    ck(cudaMemcpyAsync(&bad, dBad, sizeof bad, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    ck(cudaStreamSynchronize(stream), "count_bad_bf16");
    return bad;
  };
  // The backward levels' float64 results, by restart flag: the sampled channels, and every channel of the first and
  // last batch for the dB/dC rows.
  struct BwdRefs {
    bool made = false;
    std::map<std::pair<int64_t, int64_t>, BwdChannel> ch;
    std::map<int64_t, std::vector<double>> dB, dC;  // by batch: [16][L]
  };
  BwdRefs bwd_refs[2];
  const std::vector<int64_t> bwd_row_batches = S.batch > 1 ? std::vector<int64_t>{0, S.batch - 1} : std::vector<int64_t>{0};
  const auto bwd_reference = [&](bool restart) -> const BwdRefs& {
    BwdRefs& r = bwd_refs[restart ? 1 : 0];
    if (r.made) return r;
    for (int64_t b : bwd_row_batches) {
      std::vector<double>& rb = r.dB[b];
      std::vector<double>& rc = r.dC[b];
      rb.assign(size_t(16 * S.len), 0.0);
      rc.assign(size_t(16 * S.len), 0.0);
      BwdChannel one;
      for (int64_t d = 0; d < S.dim; ++d) {
        reference_bwd_channel(S, restart, b, d, &one, rb.data(), rc.data());
        for (const auto& sd : samples)
          if (sd.first == b && sd.second == d) r.ch[sd] = one;
      }
    }
    for (const auto& sd : samples)
      if (!r.ch.count(sd)) reference_bwd_channel(S, restart, sd.first, sd.second, &r.ch[sd], nullptr, nullptr);
    r.made = true;
    return r;
  };
  const auto check_bwd = [&](const LevelDef& L, std::string* what) -> bool {
    const bool restart = L.level == kBwdSweep, red = L.kernel != "roofline_bwd_sweep";
    for (const uint16_t* p : {bw.gu, bw.aq}) {
      if (const unsigned long long bad = count_bad(p); bad != 0) {
        *what = std::to_string(bad) + (p == bw.gu ? " elements of gu" : " elements of aq") +
                " unwritten (still the NaN poison) or not finite";
        return false;
      }
    }
    const BwdRefs& ref = bwd_reference(restart);
    double e_rows = 0, e_state = 0, e_db = 0;
    std::vector<uint16_t> got(static_cast<size_t>(S.len));
    std::vector<float> g16(16);
    for (const auto& sd : samples) {
      const BwdChannel& rc = ref.ch.at(sd);
      const size_t off = static_cast<size_t>((sd.first * S.dim + sd.second) * S.len);
      ck(cudaMemcpy(got.data(), bw.gu + off, S.len * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(gu row)");
      e_rows = std::max(e_rows, row_error(got, rc.gu));
      ck(cudaMemcpy(got.data(), bw.aq + off, S.len * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(aq row)");
      e_rows = std::max(e_rows, row_error(got, rc.aq));
      const size_t so = static_cast<size_t>((sd.first * S.dim + sd.second) * 16);
      const std::pair<const float*, const double*> per_state[] = {{bw.dA, rc.dA}, {bw.dBc, rc.dBc}, {bw.dCc, rc.dCc}};
      for (int w = 0; w < (red ? 1 : 3); ++w) {
        ck(cudaMemcpy(g16.data(), per_state[w].first + so, 16 * sizeof(float), cudaMemcpyDeviceToHost),
           "cudaMemcpy(per-state sums)");
        e_state = std::max(e_state, rel_err(std::vector<double>(g16.begin(), g16.end()),
                                            std::vector<double>(per_state[w].second, per_state[w].second + 16)));
      }
    }
    if (red) {
      std::vector<float> row(static_cast<size_t>(S.len));
      for (int64_t b : bwd_row_batches)
        for (int n : {0, 7, 15})
          for (int isC = 0; isC < 2; ++isC) {
            const std::vector<double>& full = (isC ? ref.dC : ref.dB).at(b);
            ck(cudaMemcpy(row.data(), (isC ? bw.dC : bw.dB) + (b * 16 + n) * S.len, S.len * sizeof(float),
                          cudaMemcpyDeviceToHost),
               "cudaMemcpy(dB/dC row)");
            e_db = std::max(e_db, rel_err(std::vector<double>(row.begin(), row.end()),
                                          std::vector<double>(full.begin() + n * S.len, full.begin() + (n + 1) * S.len)));
          }
    }
    // gu/aq are bf16 (kTol as the forward's outputs); the fp32 sums err by ~1e-6 relative, the approximate ex2 by
    // ~1e-7 per step.
    constexpr double kTolF32 = 1e-3;
    *what = "max err gu/aq " + fmt("%.1e", e_rows) + ", dA" + (red ? "" : "/dB/dC sums") + " " + fmt("%.1e", e_state) +
            (red ? ", dB/dC rows " + fmt("%.1e", e_db) : std::string()) + " (" + std::to_string(samples.size()) +
            " channels x every step vs float64; tol " + fmt("%.0e", kTol) + " bf16, " + fmt("%.0e", kTolF32) + " fp32)";
    return e_rows <= kTol && e_state <= kTolF32 && e_db <= kTolF32;
  };

  const auto check = [&](const LevelDef& L, const Set& st, std::string* what) -> bool {
    ck(cudaStreamSynchronize(stream), ("running " + L.name).c_str());
    if (L.level >= kBwdSweep) return check_bwd(L, what);
    if (L.level == kExp) {
      std::vector<float> got(static_cast<size_t>(blocks * threads));
      ck(cudaMemcpy(got.data(), dExp, got.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy(exp out)");
      double worst = 0;
      int nsampled = 0;
      for (int64_t i = 0; i < int64_t(got.size()); i += std::max<int64_t>(1, int64_t(got.size()) / 97), ++nsampled) {
        double tot = 0;
        for (int c = 0; c < kExpChains; ++c) {
          double x = gen_f32(kTX0, 0, static_cast<uint32_t>(i), c);
          for (int64_t k = 0; k < iters; ++k) {
            x = std::exp2(-x);
            tot += x;
          }
        }
        worst = std::max(worst, std::isfinite(got[size_t(i)]) ? std::fabs(got[size_t(i)] - tot) / tot : 1e30);
      }
      // Float summation of `iters` terms per chain errs by at most iters * 2^-24 relative; ex2.approx adds ~2^-22.
      const double tol = double(iters) / 16777216.0 + 1e-5;
      *what = "max rel err " + fmt("%.1e", worst) + " (" + std::to_string(nsampled) + " threads' sums vs float64, tol " +
              fmt("%.1e", tol) + ")";
      return worst <= tol;
    }
    // Every element written and finite.
    for (int which = 0; which < 2; ++which) {
      if (!(which == 0 ? L.writes_out : L.writes_out_z)) continue;
      if (const unsigned long long bad = count_bad(which == 0 ? st.out : st.out_z); bad != 0) {
        *what = std::to_string(bad) + (which == 0 ? " elements of out" : " elements of out_z") +
                " unwritten (still the NaN poison) or not finite";
        return false;
      }
    }
    double worst = 0;
    std::vector<double> ro, rz;
    std::vector<uint16_t> got(static_cast<size_t>(S.len));
    for (const auto& [b, d] : samples) {
      reference_row(S, L.level, b, d, &ro, &rz);
      const size_t off = static_cast<size_t>((b * S.dim + d) * S.len);
      if (L.writes_out) {
        ck(cudaMemcpy(got.data(), st.out + off, S.len * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(out row)");
        worst = std::max(worst, row_error(got, ro));
      }
      if (L.writes_out_z) {
        ck(cudaMemcpy(got.data(), st.out_z + off, S.len * 2, cudaMemcpyDeviceToHost), "cudaMemcpy(out_z row)");
        worst = std::max(worst, row_error(got, rz));
      }
    }
    *what = "max err " + fmt("%.1e", worst) + " (" + std::to_string(samples.size()) +
            " channels x every step vs float64; tol " + fmt("%.0e", kTol) + ")";
    return worst <= kTol;
  };

  std::vector<cudaEvent_t> ev(opt.profile ? 0 : static_cast<size_t>(opt.reps) + 1);
  for (cudaEvent_t& e : ev) ck(cudaEventCreate(&e), "cudaEventCreate");

  std::vector<Result> res(defs.size());
  bool all_ok = true;
  for (size_t li = 0; li < defs.size(); ++li) {
    const LevelDef& L = defs[li];
    Result& r = res[li];
    if (!opt.levels.count(L.level)) continue;
    if (L.level == kLibrary && !lib_problem.empty()) {
      r.check = "not run: " + lib_problem;
      all_ok = false;
      continue;
    }
    if (L.level >= kBwdSweep && !bwd_problem.empty()) {  // a shape the backward levels do not cover: not a failure
      r.check = "not run: " + bwd_problem;
      continue;
    }
    r.ran = true;
    // The checked launch, on poisoned outputs.
    ck(cudaMemsetAsync(sets[0].out, 0xff, btl_bytes, stream), "cudaMemsetAsync(poison)");
    ck(cudaMemsetAsync(sets[0].out_z, 0xff, btl_bytes, stream), "cudaMemsetAsync(poison)");
    if (L.poison) L.poison(stream);
    L.launch(sets[0], stream);
    ck(cudaGetLastError(), ("launching " + L.name).c_str());
    r.ok = check(L, sets[0], &r.check);
    all_ok = all_ok && r.ok;
    std::fprintf(stderr, "%-16s %s: %s\n", L.name.c_str(), r.ok ? "ok" : "WRONG", r.check.c_str());
    if (opt.profile || !r.ok) continue;
    // Timed: the stream is held while every launch is enqueued, then they run back to back; launch i's time is
    // the span between the events around it.
    stream_hold<<<1, 1, 0, stream>>>(static_cast<long long>(dev.clock_khz) * 5);  // ~5 ms
    for (int w = 0; w < opt.warmup; ++w) L.launch(sets[size_t((w + 1) % nsets)], stream);
    ck(cudaEventRecord(ev[0], stream), "cudaEventRecord");
    for (int i = 0; i < opt.reps; ++i) {
      L.launch(sets[size_t((opt.warmup + 1 + i) % nsets)], stream);
      ck(cudaEventRecord(ev[size_t(i) + 1], stream), "cudaEventRecord");
    }
    ck(cudaStreamSynchronize(stream), ("timing " + L.name).c_str());
    ck(cudaGetLastError(), ("timing " + L.name).c_str());
    for (int i = 0; i < opt.reps; ++i) {
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, ev[size_t(i)], ev[size_t(i) + 1]), "cudaEventElapsedTime");
      r.ms.push_back(ms);
    }
    r.median = median(r.ms);
    r.min = *std::min_element(r.ms.begin(), r.ms.end());
  }

  // ---- instruction counts from a profile of a --profile run
  std::string ncu_note;
  if (!opt.ncu_csv.empty()) {
    std::string err;
    const std::vector<NcuKernel> ks = read_ncu_csv(opt.ncu_csv, &err);
    if (!err.empty()) std::fprintf(stderr, "selscan_roofline: %s; the table has no instruction counts\n", err.c_str());
    for (size_t li = 0; li < defs.size(); ++li) {
      // Per level: the mean over launches of each kernel name, summed over the names (a library call may run more
      // than one kernel).
      std::map<std::string, std::pair<int, std::map<std::string, double>>> per_name;
      for (const NcuKernel& k : ks) {
        // No roofline kernel name is a prefix of another; the library's kernels are the rows that are not ours.
        bool mine = k.name.find(defs[li].kernel) != std::string::npos;
        if (defs[li].level == kLibrary)
          mine = k.name.find("roofline_") == std::string::npos && k.name.find("fill_bf16") == std::string::npos &&
                 k.name.find("count_bad_bf16") == std::string::npos && k.name.find("stream_hold") == std::string::npos;
        if (!mine) continue;
        auto& e = per_name[k.name];
        ++e.first;
        for (const auto& [m, v] : k.metric) e.second[m] += v;
      }
      for (const auto& [name, e] : per_name) {
        res[li].ncu_rows += e.first;
        for (const auto& [m, v] : e.second) res[li].ncu[m] += v / e.first;
      }
    }
    if (err.empty()) ncu_note = opt.ncu_csv;
  }

  // ---- report
  const double exp_floor_ms = U / dev.exp_per_s * 1e3;
  const double mufu_fwd_ms = U * double(N + 3) / double(N) / dev.exp_per_s * 1e3;
  const double clk = 1e3 * dev.clock_khz;
  std::printf("selscan_roofline: %s, %d SMs at %.0f MHz (sm_%d%d), L2 %.1f MB, D2D copy %.1f GB/s\n", dev.name.c_str(),
              dev.sms, dev.clock_khz * 1e-3, dev.cc_major, dev.cc_minor, dev.l2 * 1e-6, dev.copy_bytes_per_s * 1e-9);
  std::printf("problem %s (Bt x D x L : N), bf16 u/delta/z/B/C, fp32 A/D/delta_bias, softplus; %.4g state updates\n",
              opt.shape_text.c_str(), U);
  std::printf("grid: %lld blocks of %d threads (%d channels x %d threads, 4 states a thread), %zu B shared; %d buffer "
              "sets of %.0f MB; median of %d launches after %d warm-up\n",
              static_cast<long long>(blocks), threads, CH, TPC, smem, nsets, set_bytes * 1e-6, opt.reps, opt.warmup);
  std::printf("floors: exp %.4f ms (Bt*D*L*N ex2 at 16/clk/SM); MUFU of the full forward %.4f ms ((N+3)/N of it: "
              "softplus 1, SiLU 2 per channel-step); memory of L3 %.4f ms (%.1f MB at the copy rate)\n\n",
              exp_floor_ms, mufu_fwd_ms, dev.copy_bytes_per_s > 0 ? staged_bytes / dev.copy_bytes_per_s * 1e3 : 0.0,
              staged_bytes * 1e-6);
  const bool have_ncu = !ncu_note.empty();
  std::printf("%-16s %9s %9s %8s %8s %7s %7s", "level", "ms", "min ms", "ps/upd", "upd/clk", "exp fl", "mem fl");
  if (have_ncu) std::printf(" %8s %7s %6s %7s", "inst/upd", "xu/upd", "issue", "DRAM/min");
  std::printf("  check\n");
  for (size_t li = 0; li < defs.size(); ++li) {
    const LevelDef& L = defs[li];
    const Result& r = res[li];
    if (!opt.levels.count(L.level)) continue;
    if (r.ms.empty()) {
      std::printf("%-16s %9s %9s %8s %8s %7s %7s", L.name.c_str(), "-", "-", "-", "-", "-", "-");
    } else {
      const double t = r.median * 1e-3;
      std::printf("%-16s %9.4f %9.4f %8.3f %8.2f %6.0f%% %6.0f%%", L.name.c_str(), r.median, r.min, t / U * 1e12,
                  U / (t * clk * dev.sms), 100.0 * U / dev.exp_per_s / t,
                  dev.copy_bytes_per_s > 0 ? 100.0 * L.bytes / dev.copy_bytes_per_s / t : 0.0);
    }
    if (have_ncu) {
      const auto m = [&](const char* k) { const auto it = r.ncu.find(k); return it == r.ncu.end() ? -1.0 : it->second; };
      const double inst = m("smsp__inst_executed.sum"), xu = m("smsp__inst_executed_pipe_xu.sum");
      const double iss = m("smsp__issue_active.avg.pct_of_peak_sustained_active"), dram = m("dram__bytes.sum");
      std::printf(" %8s %7s %6s %7s", inst >= 0 ? fmt("%.2f", 32 * inst / U).c_str() : "-",
                  xu >= 0 ? fmt("%.2f", 32 * xu / U).c_str() : "-", iss >= 0 ? fmt("%.0f%%", iss).c_str() : "-",
                  dram >= 0 ? fmt("%.2f", dram / L.bytes).c_str() : "-");
    }
    std::printf("  %s%s\n", r.ran ? (r.ok ? "ok: " : "WRONG: ") : "", r.check.c_str());
  }
  std::printf(
      "\nms: median (min) per launch, CUDA events between back-to-back launches; ps/upd: GPU time per state update "
      "(Bt*D*L*N of them); upd/clk: state updates per SM clock per SM (the ex2 pipe allows 16); exp fl: the exp floor "
      "over the time; mem fl: the level's minimum bytes over the copy rate, over the time.\n");
  if (have_ncu)
    std::printf("inst/upd: warp instructions x 32 per state update (%s); xu/upd: of them on the XU pipe (MUFU); "
                "issue: issue slots used while a warp was active; DRAM/min: DRAM bytes over the level's minimum.\n",
                ncu_note.c_str());
  std::printf("Instructions per state update come from a profile (ncu needs to be allowed to read the counters):\n"
              "  ncu --csv --print-units base --clock-control none --metrics %s -k '%s' --log-file roofline-ncu.csv "
              "%s --profile --shape %s\n  %s --shape %s --ncu-csv roofline-ncu.csv\n",
              kNcuMetrics, kNcuFilter, argv[0], opt.shape_text.c_str(), argv[0], opt.shape_text.c_str());

  if (!opt.json.empty()) {
    FILE* f = std::fopen(opt.json.c_str(), "w");
    if (f == nullptr) die("--json: cannot write '" + opt.json + "'");
    std::fprintf(f, "{\n  \"device\": {\"name\": %s, \"sms\": %d, \"clock_mhz\": %.0f, \"cc\": \"%d.%d\", \"l2_mb\": %.1f, "
                    "\"d2d_GB_s\": %.1f, \"exp_per_s\": %.6g},\n",
                 json_str(dev.name).c_str(), dev.sms, dev.clock_khz * 1e-3, dev.cc_major, dev.cc_minor, dev.l2 * 1e-6,
                 dev.copy_bytes_per_s * 1e-9, dev.exp_per_s);
    std::fprintf(f, "  \"shape\": {\"batch\": %lld, \"dim\": %lld, \"seqlen\": %lld, \"dstate\": %d, \"itype\": \"bf16\", "
                    "\"state_updates\": %.0f},\n",
                 static_cast<long long>(S.batch), static_cast<long long>(S.dim), static_cast<long long>(S.len), N, U);
    std::fprintf(f, "  \"launch\": {\"blocks\": %lld, \"threads\": %d, \"smem_bytes\": %zu, \"sets\": %d, \"set_MB\": %.1f, "
                    "\"reps\": %d, \"warmup\": %d},\n",
                 static_cast<long long>(blocks), threads, smem, nsets, set_bytes * 1e-6, opt.reps, opt.warmup);
    std::fprintf(f, "  \"floors_ms\": {\"exp\": %.6f, \"mufu_forward\": %.6f, \"memory_L3\": %.6f},\n", exp_floor_ms,
                 mufu_fwd_ms, dev.copy_bytes_per_s > 0 ? staged_bytes / dev.copy_bytes_per_s * 1e3 : 0.0);
    std::fprintf(f, "  \"ncu_csv\": %s,\n  \"levels\": [", json_str(ncu_note).c_str());
    bool first = true;
    for (size_t li = 0; li < defs.size(); ++li) {
      const LevelDef& L = defs[li];
      const Result& r = res[li];
      if (!opt.levels.count(L.level)) continue;
      std::fprintf(f, "%s\n    {\"level\": %d, \"name\": %s, \"kernel\": %s, \"what\": %s, \"bytes\": %.0f, \"ok\": %s, "
                      "\"check\": %s",
                   first ? "" : ",", L.level, json_str(L.name).c_str(), json_str(L.kernel).c_str(),
                   json_str(L.what).c_str(), L.bytes, r.ok ? "true" : "false", json_str(r.check).c_str());
      first = false;
      if (!r.ms.empty()) {
        const double t = r.median * 1e-3;
        std::fprintf(f, ", \"ms\": %.6f, \"ms_min\": %.6f, \"ps_per_update\": %.5f, \"updates_per_clk_sm\": %.4f, "
                        "\"exp_floor_frac\": %.4f, \"mem_floor_frac\": %.4f",
                     r.median, r.min, t / U * 1e12, U / (t * clk * dev.sms), U / dev.exp_per_s / t,
                     dev.copy_bytes_per_s > 0 ? L.bytes / dev.copy_bytes_per_s / t : 0.0);
      }
      if (!r.ncu.empty()) {
        std::fprintf(f, ", \"ncu_launches\": %d, \"ncu\": {", r.ncu_rows);
        bool mf = true;
        for (const auto& [m, v] : r.ncu) {
          std::fprintf(f, "%s%s: %.6g", mf ? "" : ", ", json_str(m).c_str(), v);
          mf = false;
        }
        std::fprintf(f, "}");
        const auto it = r.ncu.find("smsp__inst_executed.sum");
        if (it != r.ncu.end()) std::fprintf(f, ", \"inst_per_update\": %.4f", 32 * it->second / U);
      }
      std::fprintf(f, "}");
    }
    std::fprintf(f, "\n  ]\n}\n");
    std::fclose(f);
  }

  for (Set& st : sets)
    for (uint16_t* p : {st.u, st.delta, st.z, st.B, st.C, st.out, st.out_z}) cudaFree(p);
  for (void* p : {static_cast<void*>(dA), static_cast<void*>(dD), static_cast<void*>(dBias),
                  static_cast<void*>(dLast), static_cast<void*>(dExp), static_cast<void*>(dBad), workspace,
                  static_cast<void*>(bw.gu), static_cast<void*>(bw.aq), static_cast<void*>(bw.dB),
                  static_cast<void*>(bw.dC), static_cast<void*>(bw.dBc), static_cast<void*>(bw.dCc),
                  static_cast<void*>(bw.dA), static_cast<void*>(bw.ck)})
    if (p != nullptr) cudaFree(p);
  return all_ok ? 0 : 1;
}
